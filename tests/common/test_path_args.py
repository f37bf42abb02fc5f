"""An empty path flag (an unset shell variable: ``--out "$OUT"``) is refused by name: ``Path("")``
is the current folder, which the user never gave, and messages would otherwise talk about ``.``."""

import argparse
import importlib

import pytest

from common.cli import ArgumentParser, path_arg
from common.errors import UserError

# Every command line that takes a path, with a flag of each and the other flags it requires.
PARSERS = {
    "exporting.cli": (["--run", "runs/x", "--out", "exports/x"], ["--run", "--out"]),
    "inference.cli": (["--run", "runs/x", "--prompt", "hi"], ["--run", "--prompt-file"]),
    "serving.cli": (["--run", "runs/x"], ["--run"]),
    "evaluation.cli": (["--run", "runs/x"], ["--run"]),
    "analysis.cli": (["--run", "runs/x", "--prompt", "hi"], ["--run", "--out"]),
    "analysis.cli roles": (["--run", "runs/x", "--roles"], ["--run", "--text-file"]),
    "benchmarks.induction_lab": ([], ["--out"]),
}


@pytest.mark.parametrize("text", ["", "   "])
def test_path_arg_refuses_an_empty_value(text):
    parser = ArgumentParser(prog="tool.py")
    parser.add_argument("--out", type=path_arg)
    with pytest.raises(UserError, match=r"^argument --out: must be a path, got '\s*'; see python tool.py --help$"):
        parser.parse_args(["--out", text])


def test_path_arg_keeps_a_real_path():
    assert str(path_arg("runs/tiny")) == "runs/tiny"
    assert str(path_arg(" odd name ")) == " odd name "  # a path may hold spaces; only blank is refused


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_every_command_line_refuses_an_empty_path(module):
    parser: argparse.ArgumentParser = importlib.import_module(module.split()[0]).build_parser()
    base, flags = PARSERS[module]
    parser.parse_args(base)  # the base arguments alone are accepted
    for flag in flags:
        argv = [*base, flag, ""]
        with pytest.raises(UserError, match=f"argument {flag}: must be a path, got ''"):
            parser.parse_args(argv)
