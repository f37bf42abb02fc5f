"""Serving fixtures: tiny runs built and loaded once per session, and serve.py on the chat run."""

from pathlib import Path

import pytest
import torch

from rundir.loading import load_run
from data.tokenizer import EOT
from run_testkit import ALL_OPTIONS, build_run, chat_tokenizer, tokenizer_without_chat
from server_process import running_server


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
    """The chat run's shape with value embeddings on (``run_testkit.ALL_OPTIONS``)."""
    run_dir = build_run(tmp_path_factory.mktemp("runs") / "tiny-options", chat_tokenizer(), **ALL_OPTIONS)
    return load_run(run_dir, torch.device("cpu"))


@pytest.fixture(scope="session")
def chat_server(chat_run_dir):
    """serve.py on the chat run: 4 rows and 2 waiting, a --max-tokens-cap that lets a request run on, and
    a 2 MB body limit (test_server.py's MAX_BODY) so that a context-length refusal reaches the model."""
    with running_server(chat_run_dir, "--max-batch", "4", "--max-queue", "2", "--max-tokens-cap", "20000",
                        "--max-body-bytes", "2000000") as served:
        yield served


@pytest.fixture(scope="module")
def client(chat_server):
    """The openai client of ``chat_server``."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{chat_server.base}/v1", api_key="x", max_retries=0, timeout=60)
