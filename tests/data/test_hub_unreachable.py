"""An unreachable hub is named as a network problem at once, with the offline alternatives,
instead of after tens of seconds of retries or as a 'dataset not found'."""

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import data.sources.hub as hub
from data.sources.hub import check_hub_reachable

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_train_with_an_unreachable_hub_is_one_line_naming_the_network(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
           "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "OMP_NUM_THREADS": "1"}
    args = ["--set", "data.source=hub", "--set", "data.hub.name=someone/some-corpus",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", f"run.out_dir={tmp_path / 'run'}",
            "--set", "logging.wandb.mode=disabled", "--no-progress"]
    proc = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "a network problem" in lines[0] and "not a missing dataset" in lines[0]
    assert "data.source: files" in lines[0] and "hf download" in lines[0]


def test_a_hub_that_never_answers_is_given_up_on_after_the_timeout(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    release = threading.Event()

    def never_answers(*args, **kwargs):
        release.wait(30)
        raise OSError("released by the test")  # like a late refusal; the probe has given up by then

    monkeypatch.setattr(hub.socket, "create_connection", never_answers)
    try:
        with pytest.raises(ConnectionError, match="no answer from huggingface.co:443 within 0.2 s"):
            check_hub_reachable("someone/some-corpus", timeout_s=0.2)
    finally:
        release.set()  # the probe's thread ends now, not in the middle of a later test


def test_local_directories_and_offline_mode_are_not_probed(monkeypatch, tmp_path):
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: pytest.fail("probed the network"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    check_hub_reachable(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_hub_reachable("someone/some-corpus")
