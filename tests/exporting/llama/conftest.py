"""Fixtures for the Llama and GGUF export tests: tiny Llama-shaped runs (rotary positions, no
value embeddings; tied and untied head), each exported once per session in both formats."""

from pathlib import Path

import pytest

from llama_testkit import build_llama_run


@pytest.fixture(scope="session")
def llama_runs(tmp_path_factory):
    """``llama_runs(tie=True)`` -> a Llama-shaped run directory, built once per head kind."""
    made: dict[bool, Path] = {}

    def make(tie: bool = True) -> Path:
        if tie not in made:
            made[tie] = build_llama_run(tmp_path_factory.mktemp("tied" if tie else "untied") / "run", tie=tie)
        return made[tie]

    return make


@pytest.fixture(scope="session")
def llama_folder(llama_runs):
    """``llama_folder(tie=True)`` -> (run_dir, the --format llama export of it)."""
    from exporting.llama import export_llama

    made: dict[bool, tuple[Path, Path]] = {}

    def make(tie: bool = True) -> tuple[Path, Path]:
        if tie not in made:
            run = llama_runs(tie)
            export_llama(run, run.parent / "llama")
            made[tie] = (run, run.parent / "llama")
        return made[tie]

    return make


@pytest.fixture(scope="session")
def gguf_file(llama_runs):
    """``gguf_file(tie=True)`` -> (run_dir, the model.gguf of its --format gguf export)."""
    pytest.importorskip("gguf")
    from exporting.gguf import export_gguf

    made: dict[bool, tuple[Path, Path]] = {}

    def make(tie: bool = True) -> tuple[Path, Path]:
        if tie not in made:
            run = llama_runs(tie)
            made[tie] = (run, export_gguf(run, run.parent / "gguf").out_dir / "model.gguf")
        return made[tie]

    return make
