"""The README's newcomer path for real, as a user types it (only the budget, run directory, data cache
and wandb overridden): train tiny.yaml briefly, then sample from the run. And runs with windows of 2 to 4
tokens, every kind of positions, through train.py, generate.py with a long prompt, and serve.py: the
default sinks once stopped every one of them at its first decode."""

import json
from pathlib import Path

import httpx
import pytest

from e2e_testkit import ROOT, quick_settings, run_command, run_ok
from server_process import running_server


@pytest.mark.e2e
def test_train_tiny_then_generate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train = run_ok([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
                    "--set", "train.max_steps=3", "--set", f"run.out_dir={run_dir}",
                    "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "logging.wandb.mode=disabled",
                    "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=2", "--no-progress"],
                   # generous: a loaded CI machine, and compile where tiny.yaml turns it on (CUDA)
                   cwd=tmp_path, timeout=480)
    assert "done: 3 steps" in train.stdout

    # The run directory explains itself: all generate.py needs, plus what --resume needs.
    for name in ("config.yaml", "tokenizer.json", "model_config.json", "model.safetensors",
                 "trainer_state.pt", "metrics.jsonl", "loss_curve.png"):
        assert (run_dir / name).is_file(), f"{name} missing from the run directory"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (records[-1]["kind"], records[-1]["step"]) == ("final_eval", 3)  # the final validation comes last

    gen = run_ok([str(ROOT / "generate.py"), "--run", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "20",
                  "--temperature", "0"], cwd=tmp_path, timeout=120)
    assert gen.stdout.startswith("ROMEO:")
    # Three steps of training teach little (often newlines), so check that 20 tokens of
    # continuation came out, not what they say.
    assert len(gen.stdout) > len("ROMEO:"), "no continuation was printed"
    assert "generated 20 tokens" in gen.stderr


# Windows of a few tokens

CASES = [(block, positions) for block in (2, 3, 4) for positions in ("learned", "rope", "none")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One data cache for every case: the plays are prepared once."""
    return tmp_path_factory.mktemp("small-windows")


@pytest.mark.e2e
@pytest.mark.parametrize("block, positions", CASES, ids=[f"{p}-{b}" for b, p in CASES])
def test_a_tiny_window_trains_generates_and_serves(block, positions, cache, tmp_path):
    run_dir = tmp_path / "run"
    train = run_command([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
                         *quick_settings(cache), "--set", "train.max_steps=3", "--set", f"model.block_size={block}",
                         "--set", f"model.positions={positions}", "--set", f"run.out_dir={run_dir}"], cwd=tmp_path)
    assert train.returncode == 0 and "Traceback" not in train.stderr, train.stderr[-3000:]

    generate = run_command([str(ROOT / "generate.py"), "--run", str(run_dir), "--prompt", "ROMEO: But soft, what light",
                            "--max-new-tokens", "8", "--temperature", "0"], cwd=tmp_path)
    assert generate.returncode == 0 and "Traceback" not in generate.stderr, generate.stderr[-3000:]
    assert "generated" in generate.stderr and generate.stdout.startswith("ROMEO: But soft, what light")

    long = {"model": "run", "prompt": "ROMEO: But soft, what light", "max_tokens": 8, "temperature": 0}
    with running_server(run_dir) as server:
        answered = httpx.post(f"{server.base}/v1/completions", json=long, timeout=120)
        if positions == "learned":  # its window holds at most block_size tokens from position 0
            assert answered.status_code == 400 and answered.json()["error"]["code"] == "context_length_exceeded"
            answered = httpx.post(f"{server.base}/v1/completions", json={**long, "prompt": [5]}, timeout=120)
    assert answered.status_code == 200, answered.text
    assert 1 <= answered.json()["usage"]["completion_tokens"] <= 8
