"""Fixtures for the training tests: a small generated corpus (its tokenizer trains in a fraction of a
second), tokenized once per session, a tiny, fast run config, and an RL config with the calculator in the loop."""

import copy
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from chat_testkit import pretrain
from data.prepared.text import prepare_data
from training.config import config_from_dict, with_parent

_SUBJECTS = ["the miller", "a young knight", "the old queen", "my brother", "the weaver", "a shepherd"]
_VERBS = ["walked to", "looked at", "spoke of", "dreamed of", "sang about", "rode past"]
_OBJECTS = ["the river", "the quiet hills", "a golden crown", "the market", "the winter sea", "his garden"]
_ENDINGS = ["at dawn.", "before the rain.", "with a heavy heart.", "and said nothing.", "for a long time."]


def _paragraph(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(3, 6)):
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
        sentences.append(s[0].upper() + s[1:])
    speaker = rng.choice(["ROMEO", "JULIET", "NURSE", "FRIAR"])
    return f"{speaker}:\n" + " ".join(sentences)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread (the tiny models cannot use two; on a shared machine OpenMP's spinning makes
    steps slower), for the trainer too: ``train.threads: auto`` keeps OMP_NUM_THREADS. Set by hand, not
    with ``monkeypatch``: tests that call ``monkeypatch.undo()`` would undo it midway."""
    previous_env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
    if previous_env is None:
        del os.environ["OMP_NUM_THREADS"]
    else:
        os.environ["OMP_NUM_THREADS"] = previous_env


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(_paragraph(rng) for _ in range(500)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture(scope="session")
def base_raw(corpus_file: Path, data_cache: Path) -> dict[str, Any]:
    """A config dict for a run of a few seconds (out_dir filled in per test)."""
    raw = {
        "model": {"n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "block_size": 32},
        "data": {
            "source": "files",
            "vocab_size": 300,
            "cache_dir": str(data_cache),
            "files": {"paths": [str(corpus_file)], "txt_document": "paragraph"},
        },
        "train": {
            "max_steps": 20,
            "batch_size": 8,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_steps": 3,
            "device": "cpu",
            "precision": "fp32",  # the same arithmetic on every CPU (auto picks bf16 on some)
            "compile": False,
            "peak_flops": 1e11,  # skip the matmul measurement in every run
        },
        "eval": {"interval": 10, "max_batches": 2, "sample_tokens": 8, "final_max_batches": 4},
        "logging": {"interval": 1, "wandb": {"mode": "disabled"}},
        "run": {"checkpoint_interval": 0},
    }
    # Tokenize once for the whole session; every run afterwards hits the cache.
    prepare_data(config_from_dict({**raw, "run": {"out_dir": "unused"}}).data, progress=False)
    return raw


@pytest.fixture
def make_config(base_raw: dict[str, Any], tmp_path: Path):
    """``make_config(**sections)``: the base config with per-section updates, out_dir in tmp, as a run
    starts with it (its parent run read)."""
    def make(out_dir: str | Path | None = None, **sections: dict[str, Any]):
        raw = copy.deepcopy(base_raw)
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        raw["run"]["out_dir"] = str(out_dir if out_dir is not None else tmp_path / "run")
        return with_parent(config_from_dict(raw))

    return make


@pytest.fixture(scope="session")
def parent_run(base_raw, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pretrained run that the fine-tuning tests start from, built once (tests that damage it copy it)."""
    return pretrain(base_raw, tmp_path_factory.mktemp("parent") / "run")


# The tool run learned three questions by heart: a seed whose held-out samples it answers with calls that run.
CALCULATOR = {"seed": 4, "train_problems": 40, "val_problems": 6, "digits": 2, "operations": "+-*", "max_terms": 2}


@pytest.fixture
def tool_rl_config(base_raw, tool_run_dir, tmp_path):
    """An RL config with the calculator in the loop, from the tiny run that calls it (its shape and
    tokenizer come from it)."""

    def make(out_dir: Path, rl=None, **train):
        raw = copy.deepcopy(base_raw)
        raw.pop("model")
        raw["data"] = {"format": "rl", "cache_dir": raw["data"]["cache_dir"]}
        raw["train"].update({"init_from": str(tool_run_dir), "max_steps": 4, "batch_size": 2, "grad_accum_steps": 2,
                             "lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 0, **train})
        raw["eval"] = {"interval": 2, "max_batches": 1, "sample_tokens": 40, "final_max_batches": 2}
        raw["run"] = {"checkpoint_interval": 1, "out_dir": str(out_dir)}
        raw["rl"] = {"task": "calculator", "tools": ["calculator"], "max_tool_calls": 2, "group_size": 3,
                     "max_new_tokens": 40, "rewards": ["tool_answer_correct", "tool_format"], "eval_samples": 2,
                     "updates_per_batch": 2, "beta": 0.1, "calculator": CALCULATOR, **(rl or {})}
        return with_parent(config_from_dict(raw))

    return make
