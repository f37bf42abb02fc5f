"""Fixtures for the ONNX tests: a run with a 128-position window, exported once per session in each form."""

from pathlib import Path

import pytest

from onnx_testkit import BLOCK_SIZE, Exported


@pytest.fixture(scope="session")
def onnx_run(tmp_path_factory) -> Path:
    import run_testkit
    from data.tokenizer import EOT

    # <|endoftext|> never wins, so generate.py's 100 tokens never end early.
    return run_testkit.build_run(tmp_path_factory.mktemp("onnx-run") / "run", run_testkit.chat_tokenizer(),
                                 block_size=BLOCK_SIZE, never_predicts=(EOT,))


def _export(tmp_path_factory, run: Path, static_batch: int | None) -> Exported:
    pytest.importorskip("onnxruntime")
    from model.io import load_pretrained
    from exporting.onnx import export_onnx

    folder = tmp_path_factory.mktemp("onnx-export") / ("static" if static_batch else "dynamic")
    export_onnx(run, folder, static_batch=static_batch)
    return Exported(folder, load_pretrained(run))


@pytest.fixture(scope="session")
def dynamic_export(tmp_path_factory, onnx_run) -> Exported:
    return _export(tmp_path_factory, onnx_run, None)


@pytest.fixture(scope="session")
def static_export(tmp_path_factory, onnx_run) -> Exported:
    return _export(tmp_path_factory, onnx_run, 1)
