"""The ``export.py`` command line: parse flags, export the run, print where it went.

``--format`` picks the exporter: ``hf`` (this package) or ``onnx`` (the sibling ``onnx_export``).

User errors (not a run, damaged weights, an output folder that exists) and filesystem failures (a
full disk, a read-only folder) print one ``error: ...`` line and exit with status 2; anything else
is a bug and keeps its traceback. Ctrl-C exits with 130 and SIGTERM with 143, both after removing
the half-written folder; only a SIGKILL leaves one, which the next export to that parent removes.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from common.cli import ArgumentParser, run_command
from common.errors import UserError
from common.os_errors import describe_os_error


class Terminated(BaseException):
    """SIGTERM, raised where the export is, so that its clean-up runs as it does for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="export.py",
        description="Write a trained run as a folder that Hugging Face transformers loads with "
        "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True), or (--format onnx) as an "
        "ONNX decoder with a key/value cache that ONNX Runtime runs without PyTorch.",
    )
    parser.add_argument("--run", required=True, type=Path, metavar="DIR", help="run directory written by train.py")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to create for the export")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --out if it holds an earlier export"
    )
    parser.add_argument("--format", choices=("hf", "onnx"), default="hf",
                        help="hf: a Hugging Face transformers folder (default); onnx: an ONNX decoder graph")
    parser.add_argument("--static-shapes", action="store_true",
                        help="with --format onnx: fixed shapes and a preallocated cache of block_size "
                        "positions, for runtimes that need them (NPUs, ahead-of-time compilers)")
    parser.add_argument("--static-batch", type=int, default=1, metavar="N",
                        help="with --static-shapes: the fixed batch size (default 1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return run_command(build_parser(), argv, _export)
    except OSError as error:
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)  # put the shell prompt back on a line of its own
        return 130
    except Terminated as stop:
        return 128 + stop.signum
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(signum)


def _export(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        return _export_onnx(args)
    if args.static_shapes:
        raise UserError("--static-shapes applies to --format onnx only; add --format onnx or drop it")
    from hf_export import export_run  # torch loads only once the flags are good

    result = export_run(args.run, args.out, overwrite=args.overwrite)
    chat = "with the chat template" if result.has_chat else "without chat tokens"
    print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {chat}) to {result.out_dir}")
    print(f"load it with: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}, trust_remote_code=True)")
    return 0


def _export_onnx(args: argparse.Namespace) -> int:
    from onnx_export import export_onnx  # torch and the exporter load only once the flags are good

    result = export_onnx(args.run, args.out, overwrite=args.overwrite,
                         static_batch=args.static_batch if args.static_shapes else None)
    form = "dynamic shapes" if result.static_batch is None else f"static shapes, batch {result.static_batch}"
    print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {form}) to {result.out_dir / 'model.onnx'}")
    print(f"decode it with onnxruntime: see {result.out_dir / 'README.md'}")
    return 0
