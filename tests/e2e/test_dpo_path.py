"""The preference path, run as a user runs it: pretrain briefly, chat-tune, then DPO by
``configs/tiny-dpo.yaml`` on a file of reply pairs. Each command is a subprocess; a tiny model, a
small generated corpus and a few steps keep the whole path to seconds."""

from __future__ import annotations

import json

import pytest

from e2e_testkit import ROOT, quick_settings, run_command

WORDS = ["the river", "the market", "his garden", "the winter sea", "the miller", "a shepherd"]


@pytest.mark.e2e
def test_pretrain_then_chat_tune_then_dpo(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"NURSE:\n{a} and {b}." for a in WORDS for b in WORDS) * 20)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{a}?"},
                                                      {"role": "assistant", "content": f"{b}."}]}) + "\n"
                             for a in WORDS for b in WORDS) * 3)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}?"}],
                                         "chosen": [{"role": "assistant", "content": f"{b}."}],
                                         "rejected": [{"role": "assistant", "content": f"{a} {a} {a} {a}"}]}) + "\n"
                             for a in WORDS for b in WORDS))
    common = quick_settings(tmp_path)
    base, chat, dpo = tmp_path / "base", tmp_path / "chat", tmp_path / "dpo"
    steps = [
        ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "data.source=files",
         "--set", f"data.files.paths=[{corpus}]", "--set", "data.files.txt_document=paragraph",
         "--set", "data.vocab_size=300", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
         "--set", "model.block_size=32", "--set", "train.batch_size=4", "--set", f"run.out_dir={base}"],
        ["--config", str(ROOT / "configs" / "tiny-chat.yaml"), "--set", f"train.init_from={base}",
         "--set", "data.source=files", "--set", f"data.files.paths=[{chats}]", "--set", "train.batch_size=4",
         "--set", f"run.out_dir={chat}"],
        ["--config", str(ROOT / "configs" / "tiny-dpo.yaml"), "--set", f"train.init_from={chat}",
         "--set", f"data.files.paths=[{pairs}]", "--set", "train.batch_size=4", "--set", "eval.interval=2",
         "--set", f"run.out_dir={dpo}"],
    ]
    for args in steps:
        done = run_command([str(ROOT / "train.py"), *args, *common, "--set", "train.max_steps=3"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
    assert "done: 3 steps" in done.stdout
    records = [json.loads(line) for line in (dpo / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train[0]["rewards/accuracies"] == 0 and train[0]["beta"] == 0.1  # the policy starts as the reference
    final = next(r for r in records if r["kind"] == "final_eval")
    assert 0 <= final["val_rewards/accuracies"] <= 1 and "val_rewards/margins" in final
    assert json.loads((dpo / "parent.json").read_text())["init_from"] == str(chat.resolve())
