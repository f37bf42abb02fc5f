"""The fine-tuning path, run as a user runs it: pretrain briefly, chat-tune the run, ask it one
question with ``generate.py --chat --prompt``. Each command is a subprocess; a tiny model, a
small generated corpus and a few steps keep the whole path to seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import train as train_cli
from e2e_testkit import ROOT, quick_settings as _common, run_command as _run

WORDS = ["the river", "the market", "his garden", "the winter sea", "the miller", "a shepherd"]


@pytest.mark.e2e
def test_pretrain_then_chat_tune_then_chat(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"NURSE:\n{a} and {b}." for a in WORDS for b in WORDS) * 20)
    chats = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{a}?"}, {"role": "assistant", "content": f"{b}."}]}
            for a in WORDS for b in WORDS]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 3))

    base = tmp_path / "base"
    pretrain = _run([
        str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"), *_common(tmp_path),
        "--set", "data.source=files", "--set", f"data.files.paths=[{corpus}]", "--set", "data.files.txt_document=paragraph",
        "--set", "data.vocab_size=300", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
        "--set", "model.block_size=32", "--set", "train.max_steps=3", "--set", "train.batch_size=4",
        "--set", f"run.out_dir={base}",
    ], cwd=tmp_path)
    assert pretrain.returncode == 0, pretrain.stderr[-3000:]

    chat = tmp_path / "chat"
    sft = _run([
        str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny-chat.yaml"), *_common(tmp_path),
        "--set", f"train.init_from={base}", "--set", "data.source=files", "--set", f"data.files.paths=[{chats}]",
        "--set", "train.max_steps=3", "--set", "train.batch_size=4", "--set", f"run.out_dir={chat}",
    ], cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert "done: 3 steps" in sft.stdout and "bits/byte" in sft.stdout
    assert json.loads((chat / "parent.json").read_text())["init_from"] == str(base.resolve())
    assert (chat / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()

    reply = _run([str(ROOT / "generate.py"), "--run", str(chat), "--chat", "--prompt", "the river?",
                  "--max-new-tokens", "8", "--seed", "1"], cwd=tmp_path)
    assert reply.returncode == 0, reply.stderr[-3000:]
    assert reply.stdout.endswith("\n") and reply.stdout.count("\n") >= 1
    assert "Traceback" not in reply.stderr

    # Bad input is one line and exit 2 (in-process: the same main() the command runs).
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    common = ["--config", str(ROOT / "configs" / "tiny-chat.yaml"), *_common(tmp_path), "--set", "train.max_steps=3"]
    code = train_cli.main([*common, "--set", f"train.init_from={base}", "--set", "data.source=files",
                           "--set", f"data.files.paths=[{bad}]", "--set", f"run.out_dir={tmp_path / 'refused'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "row 0: the conversation has no assistant turn" in err
    code = train_cli.main([*common, "--set", f"train.init_from={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: train.init_from:") and err.count("\n") == 1
