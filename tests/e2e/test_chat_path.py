"""The fine-tuning path as a user runs it: pretrain, chat-tune, ask with ``generate.py --chat --prompt``; and
the preference path on from the chat-tuned run: DPO by ``configs/tiny-dpo.yaml``; and every command on a
latent attention run."""

import json
from pathlib import Path

import httpx
import pytest
import torch

from data.chat import ChatTokenIds, Message, render_chat
from inference.cli import main as cli_main
from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from e2e_testkit import ROOT, WORDS, chat_tune_args, pretrain_args, quick_settings, run_ok, write_corpora
from server_process import running_server


@pytest.fixture(scope="module")
def chat_tuned(tmp_path_factory) -> tuple[Path, Path, Path, str]:
    """(work dir, pretrained run, its chat-tuned child, the chat-tuning's stdout): 3 steps each."""
    tmp_path = tmp_path_factory.mktemp("chat_path")
    corpus, chats = write_corpora(tmp_path)
    base, chat = tmp_path / "base", tmp_path / "chat"
    run_ok(pretrain_args(tmp_path, corpus, base, "--set", "train.max_steps=3"), cwd=tmp_path)
    sft = run_ok(chat_tune_args(tmp_path, base, chats, chat, "--set", "train.max_steps=3"), cwd=tmp_path)
    return tmp_path, base, chat, sft.stdout


@pytest.mark.e2e
def test_pretrain_then_chat_tune_then_chat(chat_tuned) -> None:
    # (Its bad input, one line and exit 2: test_conversations.py's rows, test_init_from.py's parents.)
    tmp_path, _, chat, sft_stdout = chat_tuned
    assert "done: 3 steps" in sft_stdout and "bits/byte" in sft_stdout

    reply = run_ok([str(ROOT / "generate.py"), "--run", str(chat), "--chat", "--prompt", "the river?",
                    "--max-new-tokens", "8", "--seed", "1"], cwd=tmp_path)
    assert reply.stdout.endswith("\n")


@pytest.mark.e2e
def test_then_dpo_from_the_chat_tuned_run(chat_tuned) -> None:
    tmp_path, _, chat, _ = chat_tuned
    pairs, dpo = tmp_path / "pairs.jsonl", tmp_path / "dpo"
    pairs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}?"}],
                                         "chosen": [{"role": "assistant", "content": f"{b}."}],
                                         "rejected": [{"role": "assistant", "content": f"{a} {a} {a} {a}"}]}) + "\n"
                             for a in WORDS for b in WORDS))
    done = run_ok([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny-dpo.yaml"),
                   *quick_settings(tmp_path), "--set", f"train.init_from={chat}", "--set", "train.max_steps=3",
                   "--set", f"data.files.paths=[{pairs}]", "--set", "train.batch_size=4", "--set", "eval.interval=2",
                   "--set", f"run.out_dir={dpo}"], cwd=tmp_path)
    assert "done: 3 steps" in done.stdout
    records = [json.loads(line) for line in (dpo / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train[0]["rewards/accuracies"] == 0 and train[0]["beta"] == 0.1  # the policy starts as the reference
    final = next(r for r in records if r["kind"] == "final_eval")
    assert 0 <= final["val_rewards/accuracies"] <= 1 and "val_rewards/margins" in final


CONTROL_TEXT = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>")


@pytest.mark.e2e
def test_a_barely_trained_chat_never_shows_a_control_token(chat_tuned, capsys) -> None:
    """The chat rule (data.chat.ChatTokenIds): role tokens are never sampled, <|end|> and
    <|endoftext|> end the reply unseen; in generate.py --chat and in the server's chat endpoint."""
    _, _, chat, _ = chat_tuned
    run = load_run(chat, torch.device("cpu"))
    special = ChatTokenIds.of(run.tokenizer)
    prompt = render_chat(run.tokenizer, [Message("user", "the river?")], add_generation_prompt=True).ids
    # Without the rule this model does sample role tokens here, so the checks below can fail.
    unruled = generate_completions(run, prompt, GenerationSettings(max_new_tokens=24, temperature=1.5, top_p=1.0,
                                                                   num_samples=40, seed=0))
    assert any(set(c.token_ids) & set(special.suppress_ids) for c in unruled.completions)

    for seed in range(40):
        code = cli_main(["--run", str(chat), "--chat", "--prompt", "the river?", "--max-new-tokens", "24",
                         "--temperature", "1.5", "--top-p", "1", "--seed", str(seed)])
        out = capsys.readouterr().out
        assert code == 0 and not any(token in out for token in CONTROL_TEXT), (seed, out)

    with running_server(chat) as served:
        for seed in range(40):
            body = {"model": "chat", "messages": [{"role": "user", "content": "the river?"}], "max_tokens": 24,
                    "temperature": 1.5, "seed": seed}
            reply = httpx.post(f"{served.base}/v1/chat/completions", json=body, timeout=60).json()
            text = reply["choices"][0]["message"]["content"]
            assert not any(token in text for token in CONTROL_TEXT), (seed, text)


# Latent attention

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
