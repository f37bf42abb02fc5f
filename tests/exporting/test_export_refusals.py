"""export.py refuses in one line, exit 2, before writing anything, what no format can export."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

import run_testkit
from exporting.cli import main
from refusal_testkit import one_error_line


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return run_testkit.build_run(tmp_path_factory.mktemp("refusals") / "run", run_testkit.chat_tokenizer())


def _earlier_export(folder: Path, *extra: str) -> None:
    """What an earlier export leaves, for --out's checks (they read config.json's model_type)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "minigpt"}))
    for name in ("model.safetensors", *extra):
        (folder / name).write_text("an earlier export's")


def _notes(folder: Path) -> None:
    folder.mkdir()
    (folder / "draft.txt").write_text("mine")


OUTS = {  # --out, laid out in the test's own folder
    "new": ("new", None),
    "export": ("export", _earlier_export),
    "export+notes": ("export", lambda folder: _earlier_export(folder, "notes.txt")),
    "notes": ("notes", _notes),
    "under-a-file": ("notes.txt/deeper/export", lambda folder: folder.parents[1].write_text("a file")),
    "a-file": ("notes.txt", lambda folder: folder.write_text("a file")),
}


def _damaged(run: Path) -> None:
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


RUNS = {"missing": lambda run: shutil.rmtree(run), "empty": lambda run: [p.unlink() for p in run.iterdir()],
        "damaged": _damaged}


def _no_gguf(monkeypatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))


ENVIRONMENTS = {"no-onnxscript": lambda monkeypatch: monkeypatch.setitem(sys.modules, "onnxscript", None),
                "no-gguf": _no_gguf}


@pytest.mark.parametrize("case, out, flags, fragments", [
    (None, "new", ["--format", "tflite"], ["argument --format: invalid choice: 'tflite'", "onnx"]),
    (None, "new", ["--static-shapes"], ["--static-shapes applies to --format onnx only"]),
    (None, "new", ["--format", "gguf", "--static-shapes"], ["--static-shapes applies to --format onnx only"]),
    (None, "new", ["--static-shapes", "--format", "hf"], ["--format onnx only"]),
    (None, "new", ["--static-batch", "4", "--format", "hf"], ["--static-batch applies to --format onnx only"]),
    (None, "new", ["--format", "onnx", "--static-batch", "4"], ["add --static-shapes"]),
    (None, "new", ["--format", "onnx", "--static-shapes", "--static-batch", "0"], ["between 1 and 256, got 0"]),
    (None, "new", ["--format", "onnx", "--static-shapes", "--static-batch", "257"], ["between 1 and 256, got 257"]),
    ("missing", "new", ["--format", "onnx"], ["run", "does not exist"]),
    ("empty", "new", [], ["has no model.safetensors"]),
    ("damaged", "new", ["--format", "onnx"], ["model.safetensors"]),
    (None, "export", ["--format", "onnx"], ["already exists; pass --overwrite"]),
    (None, "notes", ["--overwrite"], ["is not empty and is not an earlier export"]),
    (None, "notes", ["--format", "onnx", "--overwrite"], ["is not empty and is not an earlier export"]),
    (None, "export+notes", ["--overwrite"], ["'notes.txt', which no export writes"]),
    (None, "under-a-file", [], ["notes.txt", "which is a file"]),
    (None, "a-file", ["--format", "onnx"], ["notes.txt is a file"]),
    (None, "the-run", ["--overwrite"], ["holds the run being exported"]),
    ("no-onnxscript", "new", ["--format", "onnx"], ["onnxscript", "pip install onnxscript"]),
    ("no-gguf", "new", ["--format", "gguf"], ["pip install gguf"]),
])
def test_bad_input_is_one_line_and_writes_nothing(run, tmp_path, monkeypatch, capsys, case, out, flags, fragments):
    if case in ENVIRONMENTS:
        ENVIRONMENTS[case](monkeypatch)
    elif case in RUNS:
        run = Path(shutil.copytree(run, tmp_path / "run"))
        RUNS[case](run)
    if out == "the-run":
        destination = run = Path(shutil.copytree(run, tmp_path / "run"))
    else:
        name, lay_out = OUTS[out]
        destination = tmp_path / name
        if lay_out:
            lay_out(destination)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    one_error_line(main(["--run", str(run), "--out", str(destination), *flags]), *capsys.readouterr(), *fragments)
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
