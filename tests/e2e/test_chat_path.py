"""The fine-tuning path, run as a user runs it: pretrain briefly, chat-tune the run, ask it one
question with ``generate.py --chat --prompt``. Each command is a subprocess; a tiny model, a
small generated corpus and a few steps keep the whole path to seconds."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

import train as train_cli
from data.chat import ChatTokenIds, Message, render_chat
from inference.cli import main as cli_main
from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from e2e_testkit import ROOT, quick_settings as _common, run_command as _run
from server_process import running_server

WORDS = ["the river", "the market", "his garden", "the winter sea", "the miller", "a shepherd"]


@pytest.fixture(scope="module")
def chat_tuned(tmp_path_factory) -> tuple[Path, Path, Path, str]:
    """(work dir, pretrained run, its chat-tuned child, the chat-tuning's stdout): 3 steps each."""
    tmp_path = tmp_path_factory.mktemp("chat_path")
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
    return tmp_path, base, chat, sft.stdout


@pytest.mark.e2e
def test_pretrain_then_chat_tune_then_chat(chat_tuned, capsys) -> None:
    tmp_path, base, chat, sft_stdout = chat_tuned
    assert "done: 3 steps" in sft_stdout and "bits/byte" in sft_stdout
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
    assert code == 2 and err.count("\n") == 1 and f"{bad} line 1: the conversation has no assistant turn" in err
    code = train_cli.main([*common, "--set", f"train.init_from={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: train.init_from:") and err.count("\n") == 1


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
