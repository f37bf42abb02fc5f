"""Fixtures for the Llama and GGUF export tests: tiny Llama-shaped runs (rotary positions, no
value embeddings; tied and untied head), each exported once per session in both formats."""

from functools import cache

import pytest

from llama_testkit import build_llama_run


@pytest.fixture(scope="session")
def llama_runs(tmp_path_factory):
    """``llama_runs(tie=True)`` -> a Llama-shaped run directory, built once per head kind."""
    made = cache(lambda tie: build_llama_run(tmp_path_factory.mktemp("tied" if tie else "untied") / "run", tie=tie))
    return lambda tie=True: made(tie)


@pytest.fixture(scope="session")
def llama_folder(llama_runs):
    """``llama_folder(tie=True)`` -> (run_dir, the --format llama export of it), once per head kind."""
    from exporting.llama import export_llama

    made = cache(lambda tie: (llama_runs(tie), export_llama(llama_runs(tie), llama_runs(tie).parent / "llama").out_dir))
    return lambda tie=True: made(tie)


@pytest.fixture(scope="session")
def gguf_file(llama_runs):
    """``gguf_file(tie=True)`` -> (run_dir, the model.gguf of its --format gguf export), once per head kind."""
    pytest.importorskip("gguf")
    from exporting.gguf import export_gguf

    made = cache(lambda tie: (llama_runs(tie), export_gguf(llama_runs(tie), llama_runs(tie).parent / "gguf").out_dir
                              / "model.gguf"))
    return lambda tie=True: made(tie)
