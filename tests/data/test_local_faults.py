"""Local corpora and run files that parse but are wrong: a malformed .jsonl line is named by
file and line, and a damaged run tokenizer asks for the run's own file back rather than new data."""

import pytest
import torch

from common.errors import DataError
from data.config import DataConfig, FilesSourceConfig
from data.prepared.text import prepare_data
from data.tokenizer import train_tokenizer
from model.config import GPTConfig
from model.gpt import GPT
from model.io import save_pretrained
from rundir.loading import load_run


@pytest.mark.parametrize("bad_line, reason", [('{"text": broken', "Expecting value"),
                                              ("[1, 2]", "a JSON list, not an object"), ("\"text\"", "a JSON str")])
def test_malformed_jsonl_names_the_file_and_line(tmp_path, bad_line, reason):
    good = tmp_path / "a.jsonl"
    good.write_text('{"text": "fine"}\n' * 3)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"text": "also ok"}\n' + bad_line + "\n")
    cfg = DataConfig(source="files", cache_dir=str(tmp_path / "cache"), vocab_size=300,
                     files=FilesSourceConfig(paths=[str(good), str(bad)]))
    with pytest.raises(DataError) as info:
        prepare_data(cfg, progress=False)
    message = str(info.value)
    assert message.startswith("cannot read local jsonl files") and f"{bad} line 4: " in message and reason in message
    assert "\n" not in message


def test_a_damaged_run_tokenizer_asks_for_the_runs_own_file(copy_run_dir):
    (copy_run_dir / "tokenizer.json").write_text('{"not": "a tokenizer"')
    with pytest.raises(DataError) as info:
        load_run(copy_run_dir, "cpu")
    assert "restore the run's own tokenizer.json" in str(info.value) and "prepare the data again" not in str(info.value)


@pytest.fixture
def copy_run_dir(tmp_path):
    """A tiny saved run: model files and a real tokenizer."""
    tokenizer = train_tokenizer([["hello world, hello run"] * 20], 300, length=20)
    run = tmp_path / "run"
    torch.manual_seed(0)
    save_pretrained(GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2,
                                  n_kv_head=1, n_embd=16)), run)
    (run / "tokenizer.json").write_text(tokenizer.to_str())
    return run
