"""The ``export.py`` command line: parse flags, export the run, print where it went.

User errors (not a run, damaged weights, an output folder that exists) print one ``error: ...``
line and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from common.cli import ArgumentParser, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="export.py",
        description="Write a trained run as a folder that Hugging Face transformers loads with "
        "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).",
    )
    parser.add_argument("--run", required=True, type=Path, metavar="DIR", help="run directory written by train.py")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to create for the export")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --out if it holds an earlier export"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv, _export)


def _export(args: argparse.Namespace) -> int:
    from hf_export import export_run  # torch loads only once the flags are good

    result = export_run(args.run, args.out, overwrite=args.overwrite)
    chat = "with the chat template" if result.has_chat else "without chat tokens"
    print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {chat}) to {result.out_dir}")
    print(f"load it with: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}, trust_remote_code=True)")
    return 0
