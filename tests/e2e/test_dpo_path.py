"""The preference path as a user runs it: pretrain, chat-tune, then DPO by ``configs/tiny-dpo.yaml``."""

import json

import pytest

from e2e_testkit import ROOT, WORDS, chat_tune_args, pretrain_args, quick_settings, run_ok, write_corpora


@pytest.mark.e2e
def test_pretrain_then_chat_tune_then_dpo(tmp_path) -> None:
    corpus, chats = write_corpora(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}?"}],
                                         "chosen": [{"role": "assistant", "content": f"{b}."}],
                                         "rejected": [{"role": "assistant", "content": f"{a} {a} {a} {a}"}]}) + "\n"
                             for a in WORDS for b in WORDS))
    base, chat, dpo = tmp_path / "base", tmp_path / "chat", tmp_path / "dpo"
    steps = [pretrain_args(tmp_path, corpus, base), chat_tune_args(tmp_path, base, chats, chat),
             [str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny-dpo.yaml"), *quick_settings(tmp_path),
              "--set", f"train.init_from={chat}", "--set", f"data.files.paths=[{pairs}]", "--set", "train.batch_size=4",
              "--set", "eval.interval=2", "--set", f"run.out_dir={dpo}"]]
    for args in steps:
        done = run_ok([*args, "--set", "train.max_steps=3"], cwd=tmp_path)
    assert "done: 3 steps" in done.stdout
    records = [json.loads(line) for line in (dpo / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train[0]["rewards/accuracies"] == 0 and train[0]["beta"] == 0.1  # the policy starts as the reference
    final = next(r for r in records if r["kind"] == "final_eval")
    assert 0 <= final["val_rewards/accuracies"] <= 1 and "val_rewards/margins" in final
    assert json.loads((dpo / "parent.json").read_text())["init_from"] == str(chat.resolve())
