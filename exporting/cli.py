"""The ``export.py`` command line: parse flags, hand the run to the exporter that ``--format``
names (``exporting.hf``, ``exporting.onnx``, ``exporting.llama`` or ``exporting.gguf``, siblings that
share this package's files), print where it went.

User errors and filesystem failures print one ``error: ...`` line and exit 2. Ctrl-C (130) and
SIGTERM (143) remove the half-written folder first; a SIGKILL's is removed by the next export to
that parent (``exporting.folder``)."""

import argparse
import importlib
import importlib.util
from typing import TYPE_CHECKING, Sequence

from common.cli import ArgumentParser, path_arg, run_stoppable
from common.errors import UserError
from common.signals import held_signals

if TYPE_CHECKING:  # torch comes with it, and loads only once the flags are good
    from exporting.hf import ExportResult

# The static form preallocates a cache of batch x block_size slots per layer, and its example
# inputs are allocated at that size while exporting: a bound keeps a typo from asking for
# gigabytes. Runtimes that need fixed shapes serve a handful of rows; more is a dynamic-form job.
MAX_STATIC_BATCH = 256


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="export.py",
        description="Write a trained run as a folder that Hugging Face transformers loads with "
        "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True), or (--format onnx) as an "
        "ONNX decoder with a key/value cache that ONNX Runtime runs without PyTorch. A Llama-shaped run "
        "(model.positions rope, attention gqa, no value embeddings) also exports as a standard Llama folder "
        "(--format llama, no remote code) or as one GGUF file for llama.cpp and ollama (--format gguf).",
    )
    parser.add_argument("--run", required=True, type=path_arg, metavar="DIR", help="run directory written by train.py")
    parser.add_argument("--out", required=True, type=path_arg, metavar="DIR", help="folder to create for the export")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace --out if it holds an earlier export (and nothing else: other files stop the export)",
    )
    parser.add_argument("--format", choices=("hf", "onnx", "llama", "gguf"), default="hf",
                        help="hf: a Hugging Face transformers folder (default); onnx: an ONNX decoder graph; "
                        "llama: transformers' own LlamaForCausalLM; gguf: model.gguf for llama.cpp (f32)")
    parser.add_argument("--static-shapes", action="store_true",
                        help="with --format onnx: fixed shapes and a preallocated cache of block_size "
                        "positions, for runtimes that need them (NPUs, ahead-of-time compilers)")
    parser.add_argument("--static-batch", type=int, default=None, metavar="N",
                        help=f"with --static-shapes: the fixed batch size, 1 to {MAX_STATIC_BATCH} (default 1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, _export)


def _export(args: argparse.Namespace) -> int:
    _check_flags(args)
    if args.format == "gguf" and importlib.util.find_spec("gguf") is None:
        raise UserError("--format gguf needs the gguf package, which is not installed; install it with "
                        "pip install gguf (or pip install -r requirements-dev.txt)")
    with held_signals():  # torch loads only once the flags are good, and is never half-imported
        exporter = importlib.import_module(f"exporting.{args.format}")
    if args.format == "onnx":
        static_batch = (args.static_batch or 1) if args.static_shapes else None
        result = exporter.export_onnx(args.run, args.out, overwrite=args.overwrite, static_batch=static_batch)
        form = "dynamic shapes" if result.static_batch is None else f"static shapes, batch {result.static_batch}"
        print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {form}) to {result.out_dir / 'model.onnx'}")
        print(f"decode it with onnxruntime: see {result.out_dir / 'README.md'}")
    elif args.format == "gguf":
        from exporting.folder import GGUF_FILE  # loaded with the exporter

        result = exporter.export_gguf(args.run, args.out, overwrite=args.overwrite)
        file = result.out_dir / GGUF_FILE
        print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, f32, {_chat(result)}) to {file}")
        # -no-cnv continues the prompt instead of holding a conversation, and an f32 cache reproduces
        # generate.py's numbers (docs/export.md); -n keeps a short prompt inside the trained window.
        print(f'continue a prompt with: llama-completion -m {file} -p "The" -n {result.block_size // 2} '
              "-no-cnv -ctk f32 -ctv f32")
        if result.chat_template:
            print(f"or hold a conversation with: llama-cli -m {file}")
    elif args.format == "llama":
        result = exporter.export_llama(args.run, args.out, overwrite=args.overwrite)
        print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {_chat(result)}) as a Llama model "
              f"to {result.out_dir}")
        print(f"load it with: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r})")
    else:
        result = exporter.export_run(args.run, args.out, overwrite=args.overwrite)
        print(f"exported {args.run} ({result.num_params / 1e6:.2f}M parameters, {_chat(result)}) to {result.out_dir}")
        print(f"load it with: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}, trust_remote_code=True)")
    return 0


def _chat(result: "ExportResult") -> str:
    """Whether the export carries the chat template: only a run tuned on conversations does."""
    return "with the chat template" if result.chat_template else "no chat template: a base model, it continues text"


def _check_flags(args: argparse.Namespace) -> None:
    if args.format != "onnx" and (args.static_shapes or args.static_batch is not None):
        flag = "--static-shapes" if args.static_shapes else "--static-batch"
        raise UserError(f"{flag} applies to --format onnx only; add --format onnx or drop it")
    if args.static_batch is not None and not args.static_shapes:
        raise UserError("--static-batch sets the batch of the static form; add --static-shapes or drop it")
    if args.static_batch is not None and not 1 <= args.static_batch <= MAX_STATIC_BATCH:
        raise UserError(f"--static-batch must be between 1 and {MAX_STATIC_BATCH}, got {args.static_batch}: "
                        "the static form preallocates a cache for every row; for large batches export "
                        "the dynamic form (without --static-shapes)")
