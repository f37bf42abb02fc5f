"""python export.py --format onnx: the folder it writes, --overwrite, and what a failed export leaves."""

import ast
import json
import shutil
from pathlib import Path

import pytest

from exporting.cli import main
from refusal_testkit import one_error_line


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
    # The README's loop is valid Python for any folder name.
    from exporting.onnx.readme import decoding_loop

    folder = """/tmp/it's a "quoted" \\folder"""
    for static in (False, True):
        tree = ast.parse(decoding_loop(folder, static))
        assigned = next(node for node in tree.body if isinstance(node, ast.Assign))
        assert ast.literal_eval(assigned.value)[0] == folder


def test_a_failed_export_leaves_nothing_and_a_killed_ones_leftover_is_removed(onnx_run, tmp_path, monkeypatch):
    import exporting.onnx.writer as writer

    def half_written(model, path, **options):
        path.write_bytes(b"half a graph")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(writer, "export_graph", half_written)
    with pytest.raises(RuntimeError, match="interrupted"):
        writer.export_onnx(onnx_run, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its hidden staging sibling
    # A SIGKILL's leftover is removed by the next export (both formats clean up through exporting.folder).
    monkeypatch.setattr(writer, "export_graph", lambda model, path, **options: path.write_bytes(b"a graph"))
    gone = 2**22 + 12345  # above Linux's largest pid: no process has it
    leftover = tmp_path / f".tiny.{gone}-{'d' * 12}.tmp"
    leftover.mkdir()
    writer.export_onnx(onnx_run, tmp_path / "other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_the_static_form_replaces_an_earlier_export_and_takes_a_window_too_short_to_trace(capsys, onnx_run,
                                                                                         dynamic_export, tmp_path):
    out = Path(shutil.copytree(dynamic_export.folder, tmp_path / "export"))
    assert main(["--run", str(onnx_run), "--out", str(out), "--format", "onnx", "--static-shapes", "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "static shapes, batch 1" in printed and "README.md" in printed
    assert {p.name for p in tmp_path.iterdir()} == {"export"}
    assert json.loads((out / "config.json").read_text())["onnx"]["shapes"] == "static"
    # A window too short to trace is refused, and the static form still works.
    pytest.importorskip("onnxruntime")
    import run_testkit

    run = run_testkit.build_run(tmp_path / "run", run_testkit.chat_tokenizer(), block_size=4)
    one_error_line(main(["--run", str(run), "--out", str(tmp_path / "dynamic"), "--format", "onnx"]),
                   *capsys.readouterr(), "model.block_size", "--static-shapes")
    assert main(["--run", str(run), "--out", str(tmp_path / "static"), "--format", "onnx", "--static-shapes"]) == 0
    assert (tmp_path / "static" / "model.onnx").is_file()
