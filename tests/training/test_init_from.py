"""train.init_from: a run that starts from another run's weights, shape and tokenizer."""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import train as train_cli
import training.init_from as init_from_module
from common.errors import UserError
from data.prepared.text import prepare_data
from data.tokenizer import train_tokenizer
from model.io import load_pretrained
from training.config import config_from_dict, load_run_config, with_parent
from training.distributed import init_distributed
from training.trainer import Trainer, train


def test_init_from_loads_the_parents_weights_exactly_and_records_the_parent_found_once(make_config, parent_run,
                                                                                        monkeypatch, tmp_path):
    found = []
    find = init_from_module.find_parent
    monkeypatch.setattr(init_from_module, "find_parent", lambda where: found.append(where) or find(where))
    # Reading the config reads no other file: the parent is found when the run starts (with_parent).
    read = config_from_dict({"train": {"max_steps": 1, "init_from": str(parent_run / "gone")}, "model": {"n_layer": 2}})
    assert read.parent is None and read.model is None and found == []
    config = make_config(train={"init_from": str(parent_run)})
    assert found == [str(parent_run)] and config.parent.directory == parent_run
    trainer = Trainer(config, init_distributed("cpu"), progress=False)
    trainer.setup(resume=False, overwrite=False)
    assert len(found) == 1 and trainer.parent is config.parent  # the trainer did not look again
    parent = load_pretrained(parent_run)
    assert trainer.model.config == parent.config
    torch.testing.assert_close(trainer.model.state_dict(), parent.state_dict(), rtol=0, atol=0)
    # Fresh optimizer and step; the tokenizer is the parent's, byte for byte, and continued pretraining
    # tokenizes its data with it (none is trained); the parent is recorded.
    assert trainer.step == 0 and not trainer.optimizer.state
    tokenizer = (parent_run / "tokenizer.json").read_bytes()
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == tokenizer
    assert trainer.task.prepared.tokenizer_path.read_bytes() == tokenizer
    assert json.loads((tmp_path / "run" / "parent.json").read_text())["init_from"] == str(parent_run.resolve())
    trainer.logger.finish()
    # The resolved parent is no key of the saved config: train.init_from says it.
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "parent:" not in saved and f"init_from: {parent_run}" in saved


def test_a_model_section_that_disagrees_with_the_parent_names_the_field(base_raw, parent_run, tmp_path):
    raw = copy.deepcopy(base_raw)
    raw["train"]["init_from"] = str(parent_run)
    raw["run"]["out_dir"] = str(tmp_path / "run")
    raw["model"]["n_layer"] = 3
    with pytest.raises(UserError, match=r"model\.n_layer is 3 in the config but 2 in the parent run"):
        with_parent(config_from_dict(raw))
    # Agreeing fields, and settings that do not change the shape, are fine.
    raw["model"]["n_layer"] = 2
    raw["model"]["dropout"] = 0.1
    assert with_parent(config_from_dict(raw)).model.dropout == 0.1


def test_init_from_refuses_a_non_run(make_config, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"is not a trained run \(no model_config.json"):
        make_config(train={"init_from": str(tmp_path / "empty")})
    with pytest.raises(UserError, match="is not a run directory"):
        make_config(train={"init_from": str(tmp_path / "missing")})


def test_init_from_refuses_a_tokenizer_that_does_not_fit_the_model(make_config, parent_run, tmp_path):
    parent = Path(shutil.copytree(parent_run, tmp_path / "parent"))
    # A tokenizer from another run: more tokens than this model has embeddings.
    bigger = train_tokenizer([f"word{i} other{i * 7}" for i in range(3000)], 600)
    (parent / "tokenizer.json").write_text(bigger.to_str())
    config = make_config(train={"init_from": str(parent)})
    with pytest.raises(UserError, match="is not the tokenizer these weights were trained with"):
        Trainer(config, init_distributed("cpu"), progress=False).setup(resume=False, overwrite=False)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.parametrize("spelling", ["runs/tiny", "./runs/tiny/", "runs//tiny", "runs/link", "ABSOLUTE"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_init_from_equal_to_out_dir_is_refused_and_the_run_is_untouched(
    base_raw, parent_run, tmp_path, monkeypatch, capsys, spelling, overwrite
):
    monkeypatch.chdir(tmp_path)
    run = Path(shutil.copytree(parent_run, tmp_path / "runs" / "tiny"))
    (tmp_path / "runs" / "link").symlink_to("tiny")
    before = _snapshot(run)
    config = tmp_path / "chat.yaml"
    config.write_text(yaml.safe_dump({**base_raw, "train": {**base_raw["train"], "init_from": "runs/tiny"}}))
    out_dir = str(run.resolve()) if spelling == "ABSOLUTE" else spelling
    argv = ["--config", str(config), "--set", f"run.out_dir={out_dir}"] + (["--overwrite"] if overwrite else [])
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.init_from runs/tiny is run.out_dir" in err[0] and _snapshot(run) == before, err


def test_overwrite_keeps_the_old_run_when_the_new_one_cannot_start(base_raw, parent_run, tmp_path):
    # Each of these fails after the run directory was checked but before training: every input
    # is read first, so the run being replaced is still whole afterwards.
    run = Path(shutil.copytree(parent_run, tmp_path / "run"))
    before = _snapshot(run)
    broken_parent = Path(shutil.copytree(parent_run, tmp_path / "broken"))
    (broken_parent / "model.safetensors").write_bytes(b"not weights")
    missing_data = copy.deepcopy(base_raw)
    missing_data["data"]["files"]["paths"] = [str(tmp_path / "no_such_corpus.txt")]
    missing_data["data"]["cache_dir"] = str(tmp_path / "cache")
    bad_parent = copy.deepcopy(base_raw)
    bad_parent["train"]["init_from"] = str(broken_parent)
    for raw in (missing_data, bad_parent):
        raw = copy.deepcopy(raw)
        raw["run"]["out_dir"] = str(run)
        with pytest.raises(UserError):
            train(config_from_dict(raw), overwrite=True, progress=False)
        assert _snapshot(run) == before


def test_configs_tiny_quote_continues_a_parent_on_its_passages(parent_run, data_cache, tmp_path):
    # The shipped config, its passages and steps cut down: the parent's shape and tokenizer, and
    # validation on the passages of the plays pretraining held out.
    config = load_run_config(Path(__file__).resolve().parents[2] / "configs" / "tiny-quote.yaml", [
        f"train.init_from={parent_run}", f"run.out_dir={tmp_path / 'run'}", f"data.cache_dir={data_cache}",
        "data.quotes.passages=300", "train.max_steps=2", "train.peak_flops=1e11", "train.device=cpu",
        "eval.max_batches=1", "eval.final_max_batches=1", "eval.sample_tokens=0", "logging.wandb.mode=disabled"])
    result = train(config, progress=False)
    assert result.step == 2 and load_pretrained(tmp_path / "run").config == load_pretrained(parent_run).config
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (parent_run / "tokenizer.json").read_bytes()
    # The data it trained on: the passages written twice, validated on the held-out plays' passages.
    meta = prepare_data(config.data, progress=False, tokenizer_file=parent_run / "tokenizer.json").meta
    assert meta["description"].startswith("passages of the plays written twice (300 of")
    assert meta["val_from"] == "split 'held-out plays'"
