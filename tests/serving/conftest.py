"""Fixtures for the serving tests: tiny runs built once per session, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.runs import load_run
from serve_testkit import build_run


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: a second intra-op thread mostly waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def chat_run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("runs") / "tiny-chat", chat=True)


@pytest.fixture(scope="session")
def plain_run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("runs") / "tiny-plain", chat=False, seed=1)


@pytest.fixture(scope="session")
def chat_run(chat_run_dir):
    return load_run(chat_run_dir, torch.device("cpu"))
