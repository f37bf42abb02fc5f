"""export.py --format llama and --format gguf: what they write and print, --overwrite, and refusals."""

import json

import pytest

import run_testkit
from refusal_testkit import one_error_line
from run_testkit import ALL_OPTIONS

pytest.importorskip("gguf")

from exporting.cli import main  # noqa: E402


def test_llama_folder_holds_transformers_files_and_no_code(llama_runs, tmp_path, capsys):
    out = tmp_path / "llama"
    assert main(["--run", str(llama_runs()), "--out", str(out), "--format", "llama"]) == 0
    assert f"from_pretrained({str(out)!r})" in capsys.readouterr().out  # no trust_remote_code to pass
    assert {path.name for path in out.iterdir()} == {"config.json", "model.safetensors", "generation_config.json",
                                                     "tokenizer.json", "tokenizer_config.json"}
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and config["rope_theta"] == 500.0 and config["hidden_act"] == "silu"


@pytest.mark.parametrize("fmt, written", [("llama", "model.safetensors"), ("gguf", "model.gguf")])
def test_overwrite_replaces_an_earlier_export_of_the_format(llama_runs, tmp_path, capsys, fmt, written):
    out = tmp_path / "out"
    args = ["--run", str(llama_runs()), "--out", str(out), "--format", fmt]
    assert main(args) == 0
    capsys.readouterr()
    first = (out / written).read_bytes()
    one_error_line(main(args), *capsys.readouterr(), "already exists; pass --overwrite")
    (out / written).write_bytes(first[:4] + b"an earlier export")
    assert main([*args, "--overwrite"]) == 0
    assert (out / written).read_bytes() == first
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("data_format", ["chat", "text"])
def test_gguf_export_is_one_file_and_says_how_to_continue_a_prompt(tmp_path, capsys, data_format):
    from llama_testkit import BLOCK_SIZE, build_llama_run

    run, out = build_llama_run(tmp_path / "run", data_format=data_format), tmp_path / "gguf"
    assert main(["--run", str(run), "--out", str(out), "--format", "gguf"]) == 0
    assert [path.name for path in out.iterdir()] == ["model.gguf"]
    printed = capsys.readouterr().out
    # A plain completion (not llama.cpp's conversation mode), with the f32 cache that reproduces ours,
    # and a length that keeps a short prompt inside the window.
    assert (f'continue a prompt with: llama-completion -m {out / "model.gguf"} -p "The" -n {BLOCK_SIZE // 2} '
            "-no-cnv -ctk f32 -ctv f32") in printed
    # A conversation only for a run tuned on them, whose file carries the chat template.
    assert (f"llama-cli -m {out / 'model.gguf'}" in printed) == (data_format == "chat")
    assert ("with the chat template" in printed) == (data_format == "chat")


@pytest.mark.parametrize("fmt", ["llama", "gguf"])
@pytest.mark.parametrize("options, named", [
    (dict(positions="learned"), ["model.positions is learned"]),
    (dict(positions="none"), ["model.positions is none"]),
    (dict(positions="rope", **ALL_OPTIONS),
     ["model.value_embeddings is true (set false)"]),
    (dict(positions="rope", attention="mla", kv_latent_dim=32, n_kv_head=4), ["model.attention is mla (set gqa)"]),
], ids=["learned", "none", "options", "mla"])
def test_a_run_that_is_not_llama_is_refused_naming_each_option(tmp_path, capsys, monkeypatch, fmt, options, named):
    import rundir.loading

    run = run_testkit.build_run(tmp_path / "run", run_testkit.chat_tokenizer(), **options)
    loads = []  # refused from the config, before the weights are read
    monkeypatch.setattr(rundir.loading, "load_pretrained", lambda *a, **k: loads.append(a) or 1 / 0)
    line = one_error_line(main(["--run", str(run), "--out", str(tmp_path / "out"), "--format", fmt]),
                          *capsys.readouterr())
    assert f"cannot be exported as --format {fmt}" in line and "--format hf" in line
    for fragment in named:
        assert fragment in line
    assert not (tmp_path / "out").exists() and sorted(path.name for path in tmp_path.iterdir()) == ["run"]
    assert loads == []


@pytest.mark.parametrize("room", ["half", "tensors_only"])
def test_a_full_disk_is_one_line_and_leaves_nothing(gguf_file, mount_tmpfs, capsys, room):
    """Refused before writing when the tensors cannot fit, and after a short write when only the
    metadata is more than the disk holds."""
    from llama_testkit import read_gguf

    run_dir, path = gguf_file()
    size = path.stat().st_size
    tensors = sum(array.nbytes for array in read_gguf(path)[1].values())
    room_for_tensors = size // 4096 * 4096  # a tmpfs holds whole pages
    assert tensors <= room_for_tensors < size
    disk = mount_tmpfs(size // 2 if room == "half" else room_for_tensors)
    line = one_error_line(main(["--run", str(run_dir), "--out", str(disk / "gguf"), "--format", "gguf"]),
                          *capsys.readouterr())
    assert "No space left on device" in line and str(disk / "gguf") in line
    assert list(disk.iterdir()) == []
