"""What the end-to-end tests share: running a command as a user does, and train.py settings for seconds."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_command(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python *args`` in a subprocess, with wandb off and one torch thread."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def quick_settings(tmp_path: Path) -> list[str]:
    """train.py overrides for a run of a few steps: its own data cache, no wandb, short evaluations."""
    return ["--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "logging.wandb.mode=disabled",
            "--set", "train.max_minutes=null", "--set", "train.peak_flops=1e11", "--set", "eval.max_batches=1",
            "--set", "eval.final_max_batches=2", "--set", "eval.sample_tokens=4", "--no-progress"]


def run_ok(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``run_command`` that must succeed, with no traceback."""
    done = run_command(args, cwd, timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


WORDS = ["the river", "the market", "his garden", "the winter sea", "the miller", "a shepherd"]


def write_corpora(folder: Path) -> tuple[Path, Path]:
    """A play-like text (corpus.txt) and conversations over the same words (chats.jsonl), small
    enough that a few steps on each take seconds."""
    corpus, chats = folder / "corpus.txt", folder / "chats.jsonl"
    corpus.write_text("\n\n".join(f"NURSE:\n{a} and {b}." for a in WORDS for b in WORDS) * 20)
    rows = [{"messages": [{"role": "user", "content": f"{a}?"}, {"role": "assistant", "content": f"{b}."}]}
            for a in WORDS for b in WORDS]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    return corpus, chats


def pretrain_args(folder: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """train.py on configs/tiny.yaml over ``corpus``, shrunk to one layer of width 32."""
    return [str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"), *quick_settings(folder),
            "--set", "data.source=files", "--set", f"data.files.paths=[{corpus}]",
            "--set", "data.files.txt_document=paragraph", "--set", "data.vocab_size=300", "--set", "model.n_layer=1",
            "--set", "model.n_embd=32", "--set", "model.block_size=32", "--set", "train.batch_size=4",
            "--set", f"run.out_dir={out}", *extra]


def chat_tune_args(folder: Path, parent: Path, chats: Path, out: Path, *extra: str) -> list[str]:
    """train.py on configs/tiny-chat.yaml from the run ``parent`` over ``chats``."""
    return [str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny-chat.yaml"), *quick_settings(folder),
            "--set", f"train.init_from={parent}", "--set", "data.source=files", "--set", f"data.files.paths=[{chats}]",
            "--set", "train.batch_size=4", "--set", f"run.out_dir={out}", *extra]
