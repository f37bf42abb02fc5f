"""The ``export.py`` command line: parse flags, export the run, print where it went.

User errors (not a run, damaged weights, an output folder that exists) print one ``error: ...``
line and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from common.errors import UserError


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; see python export.py --help")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
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
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as done:  # --help
            return int(done.code or 0)
        from hf_export import export_run  # torch loads only once the flags are good

        result = export_run(args.run, args.out, overwrite=args.overwrite)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    chat = "with the chat template" if result.has_chat else "without chat tokens"
    print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {chat}) to {result.out_dir}")
    print(f"load it with: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}, trust_remote_code=True)")
    return 0
