"""Builders for the export tests: tiny runs like train.py writes, with config.yaml and metrics.jsonl."""

import json
import subprocess
import sys
from pathlib import Path

import yaml
from tokenizers import Tokenizer

import run_testkit
from refusal_testkit import one_error_line
from run_testkit import BLOCK_SIZE
from rundir.metrics import MetricsLog

VOCAB_SIZE = 320
FINAL_BPB = 2.34567
# Multi-head latent attention runs (with 4 heads): a latent wider than head_dim (16) with a query
# latent, a narrower one without, and with rotary positions (the decoupled rotary key, cached beside
# the latent in the same vector), one with the feed-forward width given.
MLA_SHAPES = {"wide-qlatent": {"kv_latent_dim": 32, "q_latent_dim": 24}, "narrow": {"kv_latent_dim": 8},
              "rope-qlatent": {"kv_latent_dim": 24, "q_latent_dim": 16, "positions": "rope"},
              "rope-options": {"kv_latent_dim": 8, "positions": "rope", **run_testkit.MLA_OPTIONS}}
MLA_KINDS = {f"mla-{name}": dict(n_kv_head=4, attention="mla", **shape) for name, shape in MLA_SHAPES.items()}
ROOT = Path(__file__).resolve().parents[3]

__all__ = ["BLOCK_SIZE", "FINAL_BPB", "MLA_KINDS", "MLA_SHAPES", "ROOT", "VOCAB_SIZE", "assert_one_line_error",
           "build_run", "export_in_process", "read_json", "run_export_cli", "train_test_tokenizer"]


def train_test_tokenizer(chat: bool = True) -> Tokenizer:
    """With ``chat``, the project's own recipe (chat tokens reserved); without, only <|endoftext|>,
    like a tokenizer trained before the chat format existed."""
    return run_testkit.chat_tokenizer(VOCAB_SIZE) if chat else run_testkit.tokenizer_without_chat(VOCAB_SIZE)


def build_run(directory: Path, tokenizer_path: Path, *, n_kv_head: int = 2, tie: bool = True, seed: int = 0,
              data_format: str = "chat", **options) -> Path:
    """``run_testkit.build_run`` plus config.yaml's data section (chat-tuned by default: its export
    carries the chat template) and a metrics.jsonl with a final validation record."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    run_testkit.build_run(directory, tokenizer, vocab_size=VOCAB_SIZE, n_kv_head=n_kv_head, tie=tie, seed=seed,
                          **options)
    data = {"source": "shakespeare", "format": data_format, "vocab_size": VOCAB_SIZE}
    (directory / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    metrics = MetricsLog(directory / "metrics.jsonl")
    metrics.append({"kind": "train", "step": 20, "loss": 3.0, "tokens": 5120})
    metrics.append({"kind": "final_eval", "step": 20, "val_loss": 1.5, "val_bpb": FINAL_BPB, "val_tokens": 999})
    return directory


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def run_export_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "export.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def export_in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """export.py's main in this process, read as ``run_export_cli``'s result (a subprocess only
    where the process itself is what a test proves: a signal, a traceback at exit)."""
    from exporting.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["export.py", *args], code, out, err)


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """``refusal_testkit.one_error_line`` of a finished command."""
    return one_error_line(done.returncode, done.stdout, done.stderr, *fragments)
