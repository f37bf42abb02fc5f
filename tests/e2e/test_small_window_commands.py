"""Runs with windows of 2 to 4 tokens, every kind of positions, through train.py, generate.py with a
long prompt, and serve.py: the default sinks once stopped every one of them at its first decode."""

from pathlib import Path

import httpx
import pytest

from e2e_testkit import ROOT, quick_settings, run_command
from server_process import running_server

pytestmark = pytest.mark.e2e

CASES = [(block, positions) for block in (2, 3, 4) for positions in ("learned", "rope", "none")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One data cache for every case: the plays are prepared once."""
    return tmp_path_factory.mktemp("small-windows")


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
