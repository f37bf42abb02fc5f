"""Fixtures for the inference tests: a tiny run built once per session, and generate.py in-process."""

import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from run_testkit import build_run, chat_tokenizer


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    chat_tokenizer().save(str(path))
    return path


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tokenizer_path) -> Path:
    """A read-only-by-convention run; tests that damage files copy it first (``copy_run``)."""
    return build_run(tmp_path_factory.mktemp("runs") / "tiny", Tokenizer.from_file(str(tokenizer_path)))


@pytest.fixture(scope="session")
def loaded_run(run_dir):
    from rundir.loading import load_run

    return load_run(run_dir, torch.device("cpu"))


@pytest.fixture
def cli(capsys):
    """generate.py's main in this process: ``cli(*argv)`` -> (exit code, stdout, stderr)."""
    from inference.cli import main

    def run(*argv) -> tuple[int, str, str]:
        return (main([str(arg) for arg in argv]), *capsys.readouterr())

    return run


@pytest.fixture
def copy_run(run_dir, tmp_path):
    """Copy the session run to ``tmp_path/<name>`` so a test may break or touch its files."""

    def copy(name: str = "copy") -> Path:
        return Path(shutil.copytree(run_dir, tmp_path / name))

    return copy
