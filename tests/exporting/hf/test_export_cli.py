"""python export.py: what it writes, and the refusals that need a real export; stopped by the filesystem or
a signal, one line, the previous export intact, nothing hidden left."""

import ast
import errno
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

import exporting.hf.writer as writer
from data.chat import CHAT_TEMPLATE
from exporting.cli import main
from exporting.folder import EXPORT_FILES
from exporting.hf import export_run
from export_testkit import (BLOCK_SIZE, FINAL_BPB, ROOT, assert_one_line_error, export_in_process, read_json,
    run_export_cli, train_test_tokenizer)
from signal_testkit import start_paused, stop


def test_folder_holds_what_transformers_and_the_hub_need(make_export):
    _, folder = make_export()
    names = {path.name for path in folder.iterdir()}
    assert names == {"config.json", "configuration_minigpt.py", "modeling_minigpt.py", "model.safetensors",
                     "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"}
    assert names <= EXPORT_FILES  # what --overwrite may delete covers what the export writes
    config = read_json(folder / "config.json")
    assert config["model_type"] == "minigpt" and config["architectures"] == ["MiniGPTForCausalLM"]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_minigpt.MiniGPTForCausalLM"
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == BLOCK_SIZE
    generation = read_json(folder / "generation_config.json")
    assert generation["eos_token_id"] == [0, 4]  # <|endoftext|>, <|end|>
    # <|system|>, <|user|>, <|assistant|>, <|tool|>: never sampled (<|call|> is, for a caller offering tools)
    assert generation["suppress_tokens"] == [1, 2, 3, 5]
    # A call that names no length stays in the window; one that names max_new_tokens replaces it.
    assert generation["max_new_tokens"] == BLOCK_SIZE // 2 and "max_length" not in generation
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    assert tokenizer_config["eos_token"] == tokenizer_config["pad_token"] == "<|endoftext|>"
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"{FINAL_BPB:.4f} bits/byte" in card and "Shakespeare" in card and "llama.cpp" in card


def test_shipped_code_imports_nothing_from_this_repository():
    for path in (ROOT / "exporting" / "hf" / "shipped").glob("*ing_minigpt.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {"." if node.level else node.module.split(".")[0]}
            else:
                continue
            assert roots <= {"torch", "transformers", "."}, (path.name, roots)


@pytest.mark.parametrize("data_format, template", [("text", False), ("chat", True), ("preference", True),
                                                    ("rl", True)])
def test_only_a_run_tuned_on_conversations_carries_the_chat_template(copy_run, tmp_path, data_format, template):
    # Every tokenizer reserves the chat tokens; a base (text) run's export must not look like a chat
    # model to the runtimes that pick chat mode when they find a template.
    saved = yaml.safe_load((copy_run / "config.yaml").read_text())
    saved["data"]["format"] = data_format
    (copy_run / "config.yaml").write_text(yaml.safe_dump(saved))
    result = export_run(copy_run, tmp_path / "out")
    assert result.chat_template is template
    assert ("chat_template" in read_json(tmp_path / "out" / "tokenizer_config.json")) is template
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert ("## Chat" in card) is template and ("A base model" in card) is not template
    assert f"\n# {copy_run.name}\n" in card  # the run's name, not the export folder's
    # The chat rule for output holds either way: the tokenizer has the tokens.
    assert read_json(tmp_path / "out" / "generation_config.json")["eos_token_id"] == [0, 4]


def test_a_tokenizer_without_chat_tokens_exports_without_a_template(copy_run, tmp_path):
    train_test_tokenizer(chat=False).save(str(copy_run / "tokenizer.json"))
    result = export_run(copy_run, tmp_path / "plain")
    assert not result.chat_template
    assert "chat_template" not in read_json(tmp_path / "plain" / "tokenizer_config.json")
    generation = read_json(tmp_path / "plain" / "generation_config.json")
    assert generation["eos_token_id"] == [0] and "suppress_tokens" not in generation


def test_corrupt_weights_are_refused_like_generate_py_refuses_them(copy_run, tmp_path):
    weights = copy_run / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # a flipped byte inside the tensor data
    weights.write_bytes(bytes(data))
    assert_one_line_error(run_export_cli("--run", str(copy_run), "--out", str(tmp_path / "out")), "corrupt")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_existing_output_is_refused_then_replaced_with_overwrite(make_export, tmp_path, capsys):
    run_dir, _ = make_export()
    out = tmp_path / "out"
    assert main(["--run", str(run_dir), "--out", str(out)]) == 0
    (out / "model.safetensors").write_bytes(b"an earlier export's weights")
    assert main(["--run", str(run_dir), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == b"an earlier export's weights"
    assert main(["--run", str(run_dir), "--out", str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != b"an earlier export's weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, backup or lock left behind


# Stopped by the filesystem or a signal


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_overwrite_on_a_read_only_filesystem_keeps_the_export(make_export, mount_tmpfs, capsys):
    run_dir, _ = make_export()
    disk = mount_tmpfs(1 << 20)
    assert export_in_process(capsys, "--run", str(run_dir), "--out", str(disk / "export")).returncode == 0
    before = {p.name: p.read_bytes() for p in (disk / "export").iterdir()}
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(disk / "export"), "--overwrite")
    assert "Read-only file system" in assert_one_line_error(done)
    assert {p.name: p.read_bytes() for p in (disk / "export").iterdir()} == before


def _full(path, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write() reports it


@pytest.mark.parametrize("disk, fragments", [
    ("read-only", ["{parent}", "Read-only file system", "choose a writable directory"]),
    ("half-the-weights", ["{parent}", "No space left on device", "the disk is full"]),
    # The same without a mount, which some machines do not allow: the weights' write fails.
    ("no-mount", ["{parent}/export: ", "the disk is full"]),
])
def test_a_disk_that_cannot_take_the_export_is_one_line_and_leaves_nothing(make_export, mount_tmpfs, tmp_path,
                                                                          monkeypatch, capsys, disk, fragments):
    run_dir, folder = make_export()
    if disk == "no-mount":
        monkeypatch.setattr(writer, "atomic_write_bytes", _full)
        parent = tmp_path
    else:
        size = (folder / "model.safetensors").stat().st_size // 2 if disk == "half-the-weights" else 1 << 20
        parent = mount_tmpfs(size, read_only=disk == "read-only")
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(parent / "export"))
    assert_one_line_error(done, *[fragment.replace("{parent}", str(parent)) for fragment in fragments])
    assert list(parent.iterdir()) == []


def _start_paused_export(run_dir: Path, out: Path, marker: Path, release: Path | None = None) -> subprocess.Popen:
    """export.py, paused mid-write (config.json written, the rest not) until it is signalled, or
    until ``release`` exists."""
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        import exporting.hf.writer as writer
        from exporting.cli import main

        write = writer.write_json

        def paused(path, content):
            write(path, content)
            if path.name == "config.json":
                pathlib.Path({str(marker)!r}).touch()
                release = {str(release) if release else None!r}
                for _ in range(1200):
                    if release and pathlib.Path(release).exists():
                        break
                    time.sleep(0.05)

        writer.write_json = paused
        sys.exit(main(["--run", {str(run_dir)!r}, "--out", {str(out)!r}]))
    """)
    return start_paused(["-c", script], marker)


# Ctrl-C and SIGTERM take one path, common.cli.run_stoppable (tests/common/test_stoppable.py proves
# both): this command's SIGTERM case runs with the slow tests.
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130),
                                          pytest.param(signal.SIGTERM, 143, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_interrupt_during_the_write_exits_quietly_and_cleans_up(make_export, tmp_path, signum, code):
    run_dir, _ = make_export()
    parent = tmp_path / "exports"
    process = _start_paused_export(run_dir, parent / "tiny", tmp_path / "marker")
    assert _hidden(parent)  # the half-written folder exists
    returncode, err = stop(process, signum)
    assert returncode == code, err
    assert "Traceback" not in err and err.strip() == "", err
    assert list(parent.iterdir()) == []


# A real kill (a process, seconds): with the slow tests. The default suite proves the clean-up it
# relies on in-process, on leftovers named as a killed export leaves them:
# test_leftovers_of_running_exports_stay_and_an_interrupted_swap_is_undone.
@pytest.mark.e2e
def test_a_sigkill_leftover_is_removed_by_the_next_export(make_export, tmp_path, capsys):
    run_dir, _ = make_export()
    parent = tmp_path / "exports"
    process = _start_paused_export(run_dir, parent / "tiny", tmp_path / "marker")
    process.kill()
    process.communicate(timeout=60)
    leftover = _hidden(parent)
    assert len(leftover) == 1 and leftover[0].endswith(".tmp")

    assert export_in_process(capsys, "--run", str(run_dir), "--out", str(parent / "other")).returncode == 0
    assert sorted(p.name for p in parent.iterdir()) == ["other"]


def test_leftovers_of_running_exports_stay_and_an_interrupted_swap_is_undone(make_export, tmp_path):
    run_dir, folder = make_export()
    parent = tmp_path / "exports"
    parent.mkdir()
    gone = 2**22 + 12345  # above Linux's largest pid: no process has it
    running = parent / f".busy.{os.getpid()}-{'a' * 12}.tmp"
    dead = parent / f".busy.{gone}-{'b' * 12}.tmp"
    # Killed between publish's two renames: the previous export was moved aside, and the new
    # one never arrived.
    swapped = parent / f".previous.{gone}-{'c' * 12}.old"
    for path in (running, dead):
        path.mkdir()
    subprocess.run(["cp", "-r", str(folder), str(swapped)], check=True)
    not_ours = parent / ".notes"
    not_ours.mkdir()

    export_run(run_dir, parent / "new")
    assert _hidden(parent) == sorted([running.name, not_ours.name])
    assert read_json(parent / "previous" / "config.json") == read_json(folder / "config.json")
    assert (parent / "new" / "model.safetensors").is_file()


# Two processes (seconds): with the slow tests. The default suite proves the refusal it ends in
# with test_a_folder_that_appears_during_the_export_is_never_replaced, in-process.
@pytest.mark.e2e
def test_two_exports_to_one_new_folder_cannot_both_succeed(make_export, tmp_path):
    """Both pass the check at the start and wait, then publish at once: one wins, one says so."""
    run_dir, _ = make_export()
    out, release = tmp_path / "exports" / "tiny", tmp_path / "go"
    processes = [_start_paused_export(run_dir, out, tmp_path / f"marker{i}", release) for i in range(2)]
    release.touch()
    try:
        done = [process.communicate(timeout=120) + (process.returncode,) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert sorted(code for _, _, code in done) == [0, 2], done
    loser = next(err for _, err, code in done if code == 2)
    assert loser.startswith("error: ") and len(loser.strip().splitlines()) == 1 and "appeared while" in loser
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
@pytest.mark.parametrize("content", ["a file", "empty"])
def test_a_folder_that_appears_during_the_export_is_never_replaced(make_export, tmp_path, monkeypatch, capsys,
                                                                    overwrite, content):
    """Only --overwrite of an empty folder may take its place: nothing is lost then."""
    run_dir, _ = make_export()
    out = tmp_path / "out"
    write = writer.write_json

    def someone_makes_the_folder(path, data):
        write(path, data)
        if path.name == "config.json":
            out.mkdir()
            if content == "a file":
                (out / "notes.txt").write_text("mine")

    monkeypatch.setattr(writer, "write_json", someone_makes_the_folder)
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(out), *(["--overwrite"] if overwrite else []))
    if overwrite and content == "empty":
        assert done.returncode == 0 and (out / "model.safetensors").is_file()
    else:
        assert_one_line_error(done, str(out))
        assert [p.name for p in out.iterdir()] == (["notes.txt"] if content == "a file" else [])
    if content == "a file":
        assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
