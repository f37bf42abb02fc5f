"""A benchmark is a command line like any other: one ``error:`` line, exit 2, and a --help in sentences."""

import importlib
import re
from pathlib import Path

import pytest

from bench_testkit import benchmark_scripts
from refusal_testkit import one_error_line

ROOT = Path(__file__).resolve().parents[2]

POSITIONS_REFUSALS = [
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
]
THROUGHPUT_REFUSALS = [
    (["--steps", "0"], "error: argument --steps: must be a whole number >= 1, got '0'; see "),
    (["--warmup", "x"], "error: argument --warmup: must be a whole number >= 1, got 'x'; see "),
    (["--config", "none.yaml"], "none.yaml' not found"),
    (["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.precision=fp16"], "train.precision"),
]


# Run in an empty folder holding only a-file, which nothing may change: no runs/tiny, nothing trained.
@pytest.mark.parametrize("module, args, fragments", [
    ("induction_lab", ["--seeds", "1", "--config", "none.yaml", "--out", "o"], "none.yaml' not found"),
    # Each of the induction lab's train.py refusals is a process of its own: the other is slow.
    pytest.param("induction_lab", ["--seeds", "1", "--out", "{tmp}/a-file", "--set", "train.max_steps=1"],
                 "a-file/s1: Not a directory", marks=pytest.mark.e2e),
    ("induction_lab", ["--heldout", "a-file/heldout"], "a-file/heldout: Not a directory"),
    # Without --seeds or --heldout it did nothing and exited 0, silently.
    ("induction_lab", [], ("error: nothing to do: give --seeds", "--heldout")),
    ("induction_lab", ["--out", "somewhere"], ("error: nothing to do: give --seeds", "--heldout")),
    ("attention_variants", ["--minutes", "nan"], "error: argument --minutes: must be a finite number > 0"),
    *[("attention_variants", [*args, "--out", "runs"], message) for args, message in POSITIONS_REFUSALS],
    *[("train_throughput", [*mode, *args], message)
      for mode in ([], ["--ddp"]) for args, message in THROUGHPUT_REFUSALS],
    ("train_throughput", ["--precision", "fp16"], "error: argument --precision: invalid choice: 'fp16'"),
    # These parsed their own flags, outside common.cli.run_command: the loader's refusal was a traceback.
    *[(module, [flag, "gone"], "error: run directory gone does not exist; ") for module, flag in [
        ("chat_eval", "--runs"), ("generate_speed", "--run"), ("prefix_cache", "--run"), ("serve_throughput", "--run"),
        ("speculative", "--run")]],
    ("chat_eval", ["--runs", "runs/tiny", "--replies", "0"], "error: argument --replies: must be a whole number >= 1"),
    ("chat_eval", ["--runs", "runs/tiny", "--max-new-tokens", "-1"],
     "error: argument --max-new-tokens: must be a whole number >= 1"),
    ("chat_eval", [], "error: the following arguments are required: --runs"),
    ("speculative", ["--new-tokens", "0"], "argument --new-tokens: must be a whole number >= 1, got '0'"),
    ("speculative", ["--k", "-2"], "argument --k: must be a whole number >= 1"),
    ("speculative", [],
     "no run at runs/tiny: train one (python train.py --config configs/tiny.yaml) or pass --run DIR"),
    ("quality_per_minute", [], "nothing to screen: give --candidate NAME KEY=VALUE"),
    ("quality_per_minute", ["--candidate", "rope"], "--candidate rope: give its overrides as SECTION.KEY=VALUE"),
    ("quality_per_minute", ["--candidate", "rope", "model.positions"],
     "--candidate rope: give its overrides as SECTION.KEY=VALUE"),
    ("quality_per_minute", ["--candidate", "baseline", "train.lr=1e-3"], "--candidate baseline: a name is a new word"),
    ("quality_per_minute", ["--candidate", "a", "train.lr=1e-3", "--candidate", "a", "train.lr=2e-3"],
     "name each candidate once"),
    ("quality_per_minute", ["--candidate", "../up", "train.lr=1e-3"], "--candidate ../up: a name is a new word"),
    ("quality_per_minute", ["--candidate", "a", "train.lr=1e-3", "--steps", "10", "--short-steps", "10"],
     "--short-steps (10) must be below --steps (10)"),
    ("tool_lab", [], "the following arguments are required: --seeds"),
    ("tool_lab", ["--seeds"], "argument --seeds: expected at least one argument"),
    ("tool_lab", ["--seeds", "-1"], "argument --seeds: must be a whole number >= 0, got '-1'"),
    ("tool_lab", ["--seeds", "1", "--size", "huge"], "argument --size: invalid choice: 'huge'"),
    ("tool_lab", ["--seeds", "1", "--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
    ("tool_lab", ["--seeds", "1", "--size", "toy", "--out", "a-file"], ("a-file/s1", "Not a directory")),
])
def test_bad_input_is_one_line_and_changes_nothing(module, args, fragments, tmp_path, monkeypatch, capsys):
    main = importlib.import_module(f"benchmarks.{module}").main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("mine\n")
    code = main([arg.format(tmp=tmp_path) for arg in args])  # {tmp}: a train.py process runs elsewhere
    one_error_line(code, *capsys.readouterr(), *(fragments if isinstance(fragments, tuple) else (fragments,)))
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"] and (tmp_path / "a-file").read_text() == "mine\n"


BENCHMARKS = benchmark_scripts()


def test_every_benchmark_script_has_a_smoke_test() -> None:
    smoke = (Path(__file__).parent / "test_benchmarks_run.py").read_text()
    missing = set(BENCHMARKS) - set(re.findall(r'\bbench\("(\w+)"', smoke))
    assert BENCHMARKS and not missing, f"benchmarks without a smoke test in test_benchmarks_run.py: {sorted(missing)}"


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
def test_every_benchmarks_help_describes_it_in_whole_sentences_and_gives_each_value_its_default(name, capsys):
    """A flag that takes a value says what it is when left out, or that it is required."""
    main = importlib.import_module(f"benchmarks.{name}").main
    assert main(["--help"]) == 0
    said = capsys.readouterr().out
    usage, description = said.split("\n\n")[:2]
    assert usage.startswith("usage: ")
    assert " ".join(description.split()).endswith("."), description
    options = said.split("\noptions:\n")[1].split("\n\n")[0]
    entries = re.split(r"\n(?=  -)", options)
    silent = [entry.split()[0] for entry in entries if OPTION.match(entry)
              and not re.search(r"\bdefault\b|\brequired\b", " ".join(entry.split()))]
    assert not silent, f"benchmarks.{name} --help gives no default for {silent}"
