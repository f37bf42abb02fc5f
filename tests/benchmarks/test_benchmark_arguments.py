"""A benchmark is a command line like any other: bad input is one ``error:`` line and exit 2, and its
--help says what it measures in whole sentences."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from bench_testkit import benchmark_scripts


def _induction_lab(args: list[str], capsys) -> str:
    from benchmarks.induction_lab import main

    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), (out, err)
    return err


# Each refusal is a train.py process of its own: one by default, the other with the slow tests.
@pytest.mark.parametrize("refusal", ["missing config", pytest.param("out under a file", marks=pytest.mark.e2e)])
def test_the_induction_lab_passes_on_train_pys_refusal_in_one_line(tmp_path, capsys, refusal):
    if refusal == "missing config":
        err = _induction_lab(["--seeds", "1", "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")],
                             capsys)
        assert "none.yaml' not found" in err
    else:
        (tmp_path / "a-file").write_text("mine\n")
        err = _induction_lab(["--seeds", "1", "--out", str(tmp_path / "a-file"), "--set", "train.max_steps=1"],
                             capsys)
        assert "a-file/s1: Not a directory" in err
        assert (tmp_path / "a-file").read_text() == "mine\n"


def test_the_induction_lab_names_a_held_out_folder_it_cannot_make(tmp_path, capsys):
    (tmp_path / "a-file").write_text("mine\n")
    err = _induction_lab(["--heldout", str(tmp_path / "a-file" / "heldout")], capsys)
    assert "a-file/heldout: Not a directory" in err


def test_the_attention_variants_refuse_a_bad_clock_in_one_line(capsys):
    from benchmarks.attention_variants import main

    assert main(["--minutes", "nan"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --minutes: must be a finite number > 0")


@pytest.mark.parametrize("args, message", [
    (["--positions", "rotary"], "--positions: unknown kind 'rotary'; choose from learned, rope, none"),
    (["--positions", "rope", "learned", "rope"], "--positions names rope twice; give each once"),
    (["--positions"], "argument --positions: expected at least one argument"),
    (["--positions", "rope", "--forms"], "--forms and --positions are separate benchmarks; give one of them"),
    (["--lengths", "2", "4"], "--lengths go with --positions; add --positions learned rope none"),
    (["--sink-windows", "4"], "--sink-windows go with --positions"),
    (["--positions", "rope", "--lengths", "1", "1"], "--lengths names 1 twice"),
    (["--positions", "rope", "--lengths", "0"], "argument --lengths: must be"),
    (["--positions", "rope", "--lengths", "3", "4"], "--lengths: 3 does not divide 4; give multiples that each divide"),
    (["--positions", "rope", "--lengths", "1", "64"], "--lengths: 64 times the context is past the limit of 16"),
    (["--positions", "rope", "--eval-windows", "100000"], "--eval-windows 100000 is past the limit of 4096"),
    (["--positions", "none", "--seeds", "1", "1"], "--seeds names 1 twice"),
    (["--positions", "none", "--minutes", "2", "--steps", "400"], "--minutes and --steps are two budgets"),
    (["--positions", "none", "--steps", "0"], "argument --steps: must be"),
    (["--positions", "none", "--reuse-runs"], "holds no finished run; train it first (leave out --reuse-runs)"),
])
def test_the_positions_axis_refuses_bad_flags_in_one_line_before_training(args, message, tmp_path, capsys):
    from benchmarks.attention_variants import main

    assert main([*args, "--out", str(tmp_path / "runs")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), (out, err)
    assert message in err, err
    assert not (tmp_path / "runs").exists()  # nothing trained


BENCHMARKS = benchmark_scripts()


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmarks_help_describes_it_in_whole_sentences(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    main = importlib.import_module(f"benchmarks.{name}").main
    try:
        main()
    except SystemExit as done:
        assert done.code in (0, None)
    usage, description = capsys.readouterr().out.split("\n\n")[:2]
    assert usage.startswith("usage: ")
    assert " ".join(description.split()).endswith("."), description


@pytest.mark.parametrize("module, flag", [
    ("chat_eval", "--runs"), ("generate_speed", "--run"),
    ("prefix_cache", "--run"), ("serve_throughput", "--run"),
    ("speculative", "--run"),
])
def test_a_benchmark_given_a_run_that_is_not_there_says_so_in_one_line(module, flag, tmp_path, capsys):
    # These parsed their own flags, outside common.cli.run_command: the loader's refusal was a traceback.
    main = importlib.import_module(f"benchmarks.{module}").main
    assert main([flag, str(tmp_path / "gone")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith(f"error: run directory {tmp_path / 'gone'} does not exist; "), err


@pytest.mark.parametrize("args", [[], ["--out", "somewhere"]])
def test_the_induction_lab_with_nothing_to_do_says_so(args, capsys):
    # Without --seeds or --heldout it did nothing and exited 0, silently.
    err = _induction_lab(args, capsys)
    assert err.startswith("error: nothing to do: give --seeds") and "--heldout" in err


@pytest.mark.parametrize("mode", [[], ["--ddp"]], ids=["", "ddp"])
@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "error: argument --steps: must be a whole number >= 1, got '0'; see "),
    (["--warmup", "x"], "error: argument --warmup: must be a whole number >= 1, got 'x'; see "),
    (["--config", "{tmp}/none.yaml"], "none.yaml' not found"),
    (["--set", "train.precision=fp16"], "train.precision"),
])
def test_the_training_throughput_benchmark_refuses_bad_flags_in_one_line(mode, args, message, tmp_path, capsys):
    from benchmarks.train_throughput import main

    assert main([*mode, *(arg.format(tmp=tmp_path) for arg in args)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), (out, err)
    assert message in err, err


def test_train_throughput_refuses_an_unknown_precision_and_bf16_on_a_gpu_without_it(monkeypatch, capsys):
    import torch

    from benchmarks.train_throughput import main, measured_precisions
    from common.errors import UserError

    assert main(["--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: argument --precision: invalid choice: 'fp16'"), err
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    gpu = torch.device("cuda")
    assert measured_precisions("fp32", gpu) == [torch.float32]
    with pytest.raises(UserError, match=r"^--precision both times bf16, which this GPU does not support; "
                                        r"use --precision fp32$"):
        measured_precisions("both", gpu)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_refuses_a_bad_flag_in_one_line(name, capsys):
    # Several parsed with plain argparse, whose refusal is four lines of usage and its own message.
    main = importlib.import_module(f"benchmarks.{name}").main
    assert main(["--no-such-flag"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith("error: ") and err.endswith(f"; see python -m benchmarks.{name} --help\n"), err


# An option entry of --help that takes a value: "  --flag VALUE  help..." (its help may wrap).
OPTION = re.compile(r"^  (-\w, )?(?P<flag>--[\w-]+) (?P<takes>[A-Z{\[])", re.M)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmarks_help_gives_each_value_its_default(name, capsys):
    """A flag that takes a value says what it is when left out, or that it is required."""
    main = importlib.import_module(f"benchmarks.{name}").main
    assert main(["--help"]) == 0
    options = capsys.readouterr().out.split("\noptions:\n")[1].split("\n\n")[0]
    entries = re.split(r"\n(?=  -)", options)
    silent = [entry.split()[0] for entry in entries if OPTION.match(entry)
              and not re.search(r"\bdefault\b|\brequired\b", " ".join(entry.split()))]
    assert not silent, f"benchmarks.{name} --help gives no default for {silent}"


@pytest.mark.parametrize("args, words", [
    (["--runs", "runs/tiny", "--replies", "0"], "argument --replies: must be a whole number >= 1"),
    (["--runs", "runs/tiny", "--max-new-tokens", "-1"], "argument --max-new-tokens: must be a whole number >= 1"),
    ([], "the following arguments are required: --runs"),
])
def test_chat_eval_refuses_bad_arguments_in_one_line(args, words, capsys):
    from benchmarks.chat_eval import main

    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {words}"), err


@pytest.mark.parametrize("args, message", [
    (["--new-tokens", "0"], "argument --new-tokens: must be a whole number >= 1, got '0'"),
    (["--k", "-2"], "argument --k: must be a whole number >= 1"),
    ([], "no run at runs/tiny: train one (python train.py --config configs/tiny.yaml) or pass --run DIR"),
])
def test_the_speculative_benchmark_refuses_in_one_line(args, message, tmp_path, monkeypatch, capsys):
    from benchmarks.speculative import main

    monkeypatch.chdir(tmp_path)  # no runs/tiny here
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ") and message in err, (out, err)


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: --seeds"),
    (["--seeds"], "argument --seeds: expected at least one argument"),
    (["--seeds", "-1"], "argument --seeds: must be a whole number >= 0, got '-1'"),
    (["--seeds", "1", "--size", "huge"], "argument --size: invalid choice: 'huge'"),
    (["--seeds", "1", "--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
])
def test_the_tool_lab_refuses_bad_arguments_in_one_line(args, message, capsys):
    from benchmarks.tool_lab import main

    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ") and message in err, (out, err)


def test_the_tool_lab_names_an_output_folder_it_cannot_make(tmp_path, capsys):
    from benchmarks.tool_lab import main

    (tmp_path / "a-file").write_text("mine\n")
    assert main(["--seeds", "1", "--size", "toy", "--out", str(tmp_path / "a-file")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "a-file/s1" in err and "Not a directory" in err
    assert (tmp_path / "a-file").read_text() == "mine\n"
