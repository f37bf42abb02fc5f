"""Every command on a latent attention run, as a user types it."""

import json
from pathlib import Path

import pytest
import torch

from e2e_testkit import ROOT, chat_tune_args, pretrain_args, run_ok, write_corpora

MLA = ["--set", "model.attention=mla", "--set", "model.n_kv_head=4", "--set", "model.kv_latent_dim=16",
       "--set", "model.q_latent_dim=24", "--set", "model.value_embeddings=false", "--set", "model.n_embd=64"]


def _generate(run: Path, tmp_path: Path, *extra: str) -> str:
    return run_ok([str(ROOT / "generate.py"), "--run", str(run), "--prompt", "the river", "--max-new-tokens", "40",
                   "--seed", "3", "--quiet", *extra], cwd=tmp_path).stdout


@pytest.mark.e2e
def test_an_mla_run_trains_resumes_fine_tunes_generates_and_exports(tmp_path: Path) -> None:
    corpus, chats = write_corpora(tmp_path)
    base, chat = tmp_path / "base", tmp_path / "chat"
    run_ok(pretrain_args(tmp_path, corpus, base, *MLA, "--set", "train.max_steps=3"), cwd=tmp_path)
    resumed = run_ok(pretrain_args(tmp_path, corpus, base, *MLA, "--set", "train.max_steps=5", "--resume"),
                     cwd=tmp_path)
    assert "done: 5 steps" in resumed.stdout
    saved = json.loads((base / "model_config.json").read_text())
    assert (saved["attention"], saved["kv_latent_dim"], saved["q_latent_dim"]) == ("mla", 16, 24)

    # generate.py: the cache (absorbed decoding) and --no-cache (expanded recomputation) agree.
    cached = _generate(base, tmp_path)
    assert cached and cached == _generate(base, tmp_path, "--no-cache")
    samples = run_ok([str(ROOT / "generate.py"), "--run", str(base), "--prompt", "the river", "--max-new-tokens",
                      "12", "--seed", "3", "--num-samples", "3", "--json"], cwd=tmp_path)
    assert len(json.loads(samples.stdout)["samples"]) == 3

    run_ok(chat_tune_args(tmp_path, base, chats, chat, "--set", "train.max_steps=3"), cwd=tmp_path)
    assert json.loads((chat / "model_config.json").read_text())["attention"] == "mla"
    run_ok([str(ROOT / "generate.py"), "--run", str(chat), "--chat", "--prompt", "the river?", "--max-new-tokens", "8",
            "--seed", "1"], cwd=tmp_path)
    run_ok([str(ROOT / "export.py"), "--run", str(chat), "--out", str(tmp_path / "hf")], cwd=tmp_path)
    transformers = pytest.importorskip("transformers")
    from model.io import load_pretrained

    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, load_pretrained(chat)(ids), atol=1e-5, rtol=0)
