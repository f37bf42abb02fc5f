"""A toy config (configs/tiny.yaml shrunk, its own data cache), one toy run trained from it and its
chat-tuned child: every benchmark runs at a toy size against these, so a linked command cannot rot."""

from pathlib import Path

import pytest
import yaml

from bench_testkit import ROOT, run_python

# Small enough that a training step, an export and a decode take a fraction of a second; a window
# of 64 still holds a short chat exchange, and the vocabulary keeps room for the chat tokens.
TOY_MODEL = {"n_layer": 1, "n_embd": 32, "ffn_hidden": 64, "block_size": 64}
TOY_STEPS = ["--set", "train.max_minutes=null", "--set", "train.max_steps=3", "--set", "train.batch_size=4",
             "--set", "train.peak_flops=1e11", "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=2",
             "--set", "eval.sample_tokens=4", "--set", "logging.wandb.mode=disabled", "--no-progress"]


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("benchmarks")


@pytest.fixture(scope="session")
def toy_config(bench_dir) -> Path:
    """configs/tiny.yaml at the toy size, its data cache under the session's temporary folder."""
    doc = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    doc["model"].update(TOY_MODEL)
    doc["data"].update(vocab_size=300, cache_dir=str(bench_dir / "cache"))
    path = bench_dir / "toy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def toy_run(bench_dir, toy_config) -> Path:
    """A run of the toy config trained for 3 steps (which also fills the data cache)."""
    out = bench_dir / "toy"
    proc = run_python(["train.py", "--config", str(toy_config), *TOY_STEPS, "--set", f"run.out_dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def toy_chat_run(bench_dir, toy_run) -> Path:
    """``toy_run`` chat-tuned for 3 steps by configs/tiny-chat.yaml."""
    out = bench_dir / "toy-chat"
    proc = run_python(["train.py", "--config", str(ROOT / "configs" / "tiny-chat.yaml"), *TOY_STEPS,
                       "--set", f"data.cache_dir={bench_dir / 'cache'}", "--set", f"train.init_from={toy_run}",
                       "--set", f"run.out_dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
