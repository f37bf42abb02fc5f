"""Finding the latest trained run and loading one (its refusals: tests/inference's command lines)."""

import os

import pytest
import torch

from common.errors import UserError
from rundir.files import WEIGHTS_FILE
from rundir.loading import find_latest_run, load_run
from run_testkit import build_run, chat_tokenizer


def test_the_latest_run_is_the_last_written_and_a_loaded_run_is_ready_to_sample(tmp_path):
    with pytest.raises(UserError, match="no trained run found"):
        find_latest_run(tmp_path)
    tokenizer = chat_tokenizer()
    older, newer = build_run(tmp_path / "b", tokenizer), build_run(tmp_path / "a", tokenizer)
    (tmp_path / "not-a-run").mkdir()
    os.utime(older / WEIGHTS_FILE, ns=(1, 1))
    assert find_latest_run(tmp_path) == newer
    os.utime(newer / WEIGHTS_FILE, ns=(0, 0))
    assert find_latest_run(tmp_path) == older
    # A loaded run is ready to sample.
    run_dir = build_run(tmp_path / "run", chat_tokenizer())
    run = load_run(run_dir, torch.device("cpu"))
    assert not run.model.training and run.directory == run_dir
    assert len(run.token_bytes) == run.tokenizer.get_vocab_size() and run.eot_id == run.tokenizer.token_to_id("<|endoftext|>")
    with pytest.raises(UserError, match="it holds runs: pass one of them"):
        load_run(tmp_path, torch.device("cpu"))
