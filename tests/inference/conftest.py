"""Fixtures for the inference tests: a tiny run directory built once per session in the agreed
format (``model.save_pretrained(GPT(cfg), dir)`` plus a byte-level BPE ``tokenizer.json``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from generate_testkit import build_model, train_tokenizer


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These models are tiny: on a shared 2-core machine a second intra-op thread mostly waits for
    the first (measured ~8x slower per token under load), so run single-threaded and restore."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tokenizer_path) -> Path:
    """A read-only-by-convention run; tests that damage files copy it first (``copy_run``)."""
    from model import save_pretrained
    from tokenizers import Tokenizer

    directory = tmp_path_factory.mktemp("runs") / "tiny"
    vocab_size = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()
    save_pretrained(build_model(vocab_size), directory)
    shutil.copy(tokenizer_path, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="session")
def loaded_run(run_dir):
    from inference.runs import load_run

    return load_run(run_dir, torch.device("cpu"))


@pytest.fixture
def copy_run(run_dir, tmp_path):
    """Copy the session run to ``tmp_path/<name>`` so a test may break or touch its files."""

    def copy(name: str = "copy") -> Path:
        return Path(shutil.copytree(run_dir, tmp_path / name))

    return copy
