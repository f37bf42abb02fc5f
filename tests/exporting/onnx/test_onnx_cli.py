"""python export.py --format onnx: the folder it writes, and one line with exit code 2 for every
input it refuses. Called in-process (``exporting.cli.main``): the refusals come before any export."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporting.cli import main


def _refused(capsys, *args: str) -> str:
    assert main(list(args)) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_folder_holds_the_graph_the_tokenizer_and_the_readme(dynamic_export):
    from exporting.folder import EXPORT_FILES

    names = {p.name for p in dynamic_export.folder.iterdir()}
    assert names == {"model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md"}
    assert names <= EXPORT_FILES  # what --overwrite may delete covers what the export writes
    config = dynamic_export.config
    assert config["model_type"] == "minigpt" and "auto_map" not in config  # no modeling code ships here
    assert config["onnx"]["shapes"] == "dynamic"
    readme = (dynamic_export.folder / "README.md").read_text(encoding="utf-8")
    assert "past_key_values.{i}.key" in readme and "--static-shapes" in readme


def test_existing_out_unknown_format_and_missing_run_are_one_line(capsys, onnx_run, dynamic_export, tmp_path):
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(dynamic_export.folder), "--format", "onnx")
    assert "already exists" in line and "--overwrite" in line
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(tmp_path / "new"), "--format", "tflite")
    assert "--format" in line and "onnx" in line
    line = _refused(capsys, "--run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "new"), "--format", "onnx")
    assert "nowhere" in line
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(tmp_path / "new"), "--static-shapes")
    assert "--format onnx" in line
    assert not (tmp_path / "new").exists()


def test_damaged_run_is_one_line(capsys, onnx_run, tmp_path):
    run = Path(shutil.copytree(onnx_run, tmp_path / "run"))
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = _refused(capsys, "--run", str(run), "--out", str(tmp_path / "out"), "--format", "onnx")
    assert "model.safetensors" in line
    assert not (tmp_path / "out").exists()


def test_failed_export_leaves_nothing_that_looks_complete(onnx_run, tmp_path, monkeypatch):
    import exporting.onnx.writer as writer

    def half_written(model, path, **options):
        path.write_bytes(b"half a graph")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(writer, "export_graph", half_written)
    with pytest.raises(RuntimeError, match="interrupted"):
        writer.export_onnx(onnx_run, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its hidden staging sibling


def test_overwrite_replaces_an_earlier_export_with_the_static_form(capsys, onnx_run, dynamic_export, tmp_path):
    out = Path(shutil.copytree(dynamic_export.folder, tmp_path / "export"))
    assert main(["--run", str(onnx_run), "--out", str(out), "--format", "onnx", "--static-shapes", "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "static shapes, batch 1" in printed and "README.md" in printed
    assert {p.name for p in tmp_path.iterdir()} == {"export"}
    import json

    assert json.loads((out / "config.json").read_text())["onnx"]["shapes"] == "static"


def test_overwrite_never_deletes_a_folder_that_is_not_an_export(capsys, onnx_run, tmp_path):
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "draft.txt").write_text("mine")
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(keep), "--format", "onnx", "--overwrite")
    assert "not an earlier export" in line and (keep / "draft.txt").read_text() == "mine"


@pytest.mark.parametrize("flags, fragment", [
    (["--static-batch", "4"], "add --static-shapes"),
    (["--static-batch", "4", "--format", "hf"], "--format onnx only"),
    (["--static-shapes", "--format", "hf"], "--format onnx only"),
    (["--static-shapes", "--static-batch", "100000000"], "between 1 and"),
    (["--static-shapes", "--static-batch", "0"], "between 1 and"),
], ids=["without-static-shapes", "batch-with-hf", "static-with-hf", "absurd-batch", "zero-batch"])
def test_static_flags_that_cannot_apply_are_refused(capsys, onnx_run, tmp_path, flags, fragment):
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(tmp_path / "new"), *(["--format", "onnx"]
                    if "--format" not in flags else []), *flags)
    assert fragment in line
    assert not (tmp_path / "new").exists()


def test_missing_onnxscript_names_the_install_command(capsys, onnx_run, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # importing it now raises ImportError
    line = _refused(capsys, "--run", str(onnx_run), "--out", str(tmp_path / "new"), "--format", "onnx")
    assert "onnxscript" in line and "pip install onnxscript" in line


def test_a_window_too_short_to_trace_is_refused_and_the_static_form_still_works(capsys, tmp_path):
    pytest.importorskip("onnxruntime")
    import run_testkit

    run = run_testkit.build_run(tmp_path / "run", run_testkit.chat_tokenizer(), block_size=4)
    line = _refused(capsys, "--run", str(run), "--out", str(tmp_path / "dynamic"), "--format", "onnx")
    assert "model.block_size" in line and "--static-shapes" in line
    assert main(["--run", str(run), "--out", str(tmp_path / "static"), "--format", "onnx", "--static-shapes"]) == 0
    assert (tmp_path / "static" / "model.onnx").is_file()


def test_a_sigkill_leftover_is_removed_by_the_next_onnx_export(onnx_run, tmp_path, monkeypatch):
    """Both formats clean up through exporting.folder; the graph itself is not needed for that."""
    import exporting.onnx.writer as writer

    monkeypatch.setattr(writer, "export_graph", lambda model, path, **options: path.write_bytes(b"a graph"))
    gone = 2**22 + 12345  # above Linux's largest pid: no process has it
    leftover = tmp_path / f".tiny.{gone}-{'d' * 12}.tmp"
    leftover.mkdir()
    writer.export_onnx(onnx_run, tmp_path / "other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_readme_loop_is_valid_python_for_any_folder_name():
    import ast

    from exporting.onnx.readme import decoding_loop

    folder = """/tmp/it's a "quoted" \\folder"""
    for static in (False, True):
        tree = ast.parse(decoding_loop(folder, static))
        assigned = next(node for node in tree.body if isinstance(node, ast.Assign))
        assert ast.literal_eval(assigned.value)[0] == folder
