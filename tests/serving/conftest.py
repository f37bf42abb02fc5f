"""Fixtures for the serving tests: tiny runs built once per session, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rundir.loading import load_run
from data.tokenizer import EOT
from run_testkit import ALL_OPTIONS, build_run, chat_tokenizer, tokenizer_without_chat


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def chat_run_dir(tmp_path_factory) -> Path:
    # Never <|endoftext|>: a completion of it runs to its max_tokens, which the tests of clients that
    # leave mid-request need, whatever the tokenizer's merges make of the random weights.
    return build_run(tmp_path_factory.mktemp("runs") / "tiny-chat", chat_tokenizer(), never_predicts=(EOT,))


@pytest.fixture(scope="session")
def plain_run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("runs") / "tiny-plain", tokenizer_without_chat(), seed=1)


@pytest.fixture(scope="session")
def chat_run(chat_run_dir):
    return load_run(chat_run_dir, torch.device("cpu"))


@pytest.fixture(scope="session")
def options_run(tmp_path_factory):
    """The chat run's shape with every small-model option on (``run_testkit.ALL_OPTIONS``)."""
    run_dir = build_run(tmp_path_factory.mktemp("runs") / "tiny-options", chat_tokenizer(), **ALL_OPTIONS)
    return load_run(run_dir, torch.device("cpu"))
