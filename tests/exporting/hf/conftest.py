"""Fixtures for the export tests: tiny runs as train.py writes them, each exported once per session."""

import shutil
from functools import cache
from pathlib import Path

import pytest

from export_testkit import build_run, train_test_tokenizer
from run_testkit import ALL_OPTIONS


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_test_tokenizer(chat=True).save(str(path))
    return path


@pytest.fixture(scope="session")
def make_export(tmp_path_factory, chat_tokenizer):
    """``make_export(n_kv_head=2, tie=True, options=False, positions="learned", **shape)`` -> (run_dir,
    export_dir), once per shape; ``options``: ``run_testkit.ALL_OPTIONS``; ``shape``: more GPTConfig."""
    from exporting.hf import export_run

    made: dict[tuple, tuple[Path, Path]] = {}

    def make(n_kv_head: int = 2, tie: bool = True, options: bool = False, positions: str = "learned",
             **shape) -> tuple[Path, Path]:
        key = (n_kv_head, tie, options, positions, *sorted(shape.items()))
        if key not in made:
            root = tmp_path_factory.mktemp("export")
            run_dir = build_run(root / "run", chat_tokenizer, n_kv_head=n_kv_head, tie=tie, positions=positions,
                                **(ALL_OPTIONS if options else {}), **shape)
            export_run(run_dir, root / "export")
            made[key] = (run_dir, root / "export")
        return made[key]

    return make


@pytest.fixture(scope="session")
def hf_models():
    """transformers models loaded from an export folder, cached by folder."""
    transformers = pytest.importorskip("transformers")
    return cache(lambda folder: transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
                 .eval())


@pytest.fixture
def copy_run(make_export, tmp_path):
    """A copy of the default run that a test may damage."""
    run_dir, _ = make_export()
    return Path(shutil.copytree(run_dir, tmp_path / "run"))
