"""Every command on a multi-head latent attention run, as a user types it: train, resume, chat
fine-tuning from it (train.init_from), generate.py with and without the cache, several samples
and --chat, and export.py to a folder transformers loads with the same logits. A bad attention
setting is one line and exit code 2 (checked in process, it needs no run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import train as train_cli
from e2e_testkit import ROOT, quick_settings, run_command

WORDS = ["the river", "the market", "his garden", "the winter sea", "the miller", "a shepherd"]
MLA = ["--set", "model.attention=mla", "--set", "model.n_kv_head=4", "--set", "model.kv_latent_dim=16",
       "--set", "model.q_latent_dim=24", "--set", "model.value_embeddings=false"]


def _generate(run: Path, tmp_path: Path, *extra: str) -> str:
    out = run_command([str(ROOT / "generate.py"), "--run", str(run), "--prompt", "the river", "--max-new-tokens", "40",
                "--seed", "3", "--quiet", *extra], cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stdout


@pytest.mark.e2e
def test_an_mla_run_trains_resumes_fine_tunes_generates_and_exports(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"NURSE:\n{a} and {b}." for a in WORDS for b in WORDS) * 20)
    base = tmp_path / "base"
    pretrain = [str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"), *quick_settings(tmp_path), *MLA,
                "--set", "data.source=files", "--set", f"data.files.paths=[{corpus}]",
                "--set", "data.files.txt_document=paragraph", "--set", "data.vocab_size=300",
                "--set", "model.n_layer=1", "--set", "model.n_embd=64", "--set", "model.block_size=32",
                "--set", "train.batch_size=4", "--set", f"run.out_dir={base}"]
    first = run_command([*pretrain, "--set", "train.max_steps=3"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_command([*pretrain, "--set", "train.max_steps=5", "--resume"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "done: 5 steps" in resumed.stdout
    saved = json.loads((base / "model_config.json").read_text())
    assert (saved["attention"], saved["kv_latent_dim"], saved["q_latent_dim"]) == ("mla", 16, 24)

    # generate.py: the cache (absorbed decoding) and --no-cache (expanded recomputation) agree.
    cached = _generate(base, tmp_path)
    assert cached and cached == _generate(base, tmp_path, "--no-cache")
    samples = run_command([str(ROOT / "generate.py"), "--run", str(base), "--prompt", "the river", "--max-new-tokens",
                    "12", "--seed", "3", "--num-samples", "3", "--json"], cwd=tmp_path)
    assert samples.returncode == 0, samples.stderr[-3000:]
    assert len(json.loads(samples.stdout)["samples"]) == 3

    chats = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{a}?"}, {"role": "assistant", "content": f"{b}."}]}
            for a in WORDS for b in WORDS]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    chat = tmp_path / "chat"
    sft = run_command([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny-chat.yaml"), *quick_settings(tmp_path),
                "--set", f"train.init_from={base}", "--set", "data.source=files", "--set", f"data.files.paths=[{chats}]",
                "--set", "train.max_steps=3", "--set", "train.batch_size=4", "--set", f"run.out_dir={chat}"],
               cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert json.loads((chat / "model_config.json").read_text())["attention"] == "mla"
    reply = run_command([str(ROOT / "generate.py"), "--run", str(chat), "--chat", "--prompt", "the river?",
                  "--max-new-tokens", "8", "--seed", "1"], cwd=tmp_path)
    assert reply.returncode == 0 and "Traceback" not in reply.stderr, reply.stderr[-3000:]

    export = run_command([str(ROOT / "export.py"), "--run", str(chat), "--out", str(tmp_path / "hf")], cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    transformers = pytest.importorskip("transformers")
    from model.io import load_pretrained

    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, load_pretrained(chat)(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("settings,words", [
    (["--set", "model.attention=foo"], "model.attention must be 'gqa' or 'mla', got 'foo'"),
    (["--set", "model.attention=mla", "--set", "model.n_kv_head=4"], "attention mla needs kv_latent_dim"),
    (["--set", "model.kv_latent_dim=32"], "kv_latent_dim is set (32) but attention is 'gqa'"),
])
def test_train_refuses_a_bad_attention_setting_in_one_line(tmp_path: Path, capsys, settings, words) -> None:
    # In-process: the same main() the command runs.
    code = train_cli.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *quick_settings(tmp_path), *settings,
                           "--set", f"run.out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
