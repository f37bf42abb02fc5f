"""The ``attention.py`` command line: draw a run's attention maps, or print its heads' roles.

Flags are checked and the run loaded before anything is written, so a failed command leaves no
file behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from analysis.maps import attention_maps, format_roles, head_roles
from analysis.plot import draw_attention_grid, draw_attention_map
from common.cli import ArgumentParser, run_command
from common.device import select_device
from common.errors import UserError
from common.os_errors import describe_os_error
from rundir.files import CONFIG_FILE, TOKENIZER_FILE
from rundir.loading import LoadedRun, find_latest_run, load_run
from rundir.record import read_config

_EPILOG = """\
examples:
  python attention.py --run runs/tiny --prompt "ROMEO: But soft, what light" --out attention.png
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --layer 1 --head 0 --out head.png
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --compare-init --out init.png
  python attention.py --run runs/tiny --prompt "ROMEO:" --json > weights.json
  python attention.py --run runs/tiny --roles
"""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="attention.py",
        description="Draw the attention weights of a trained run over a prompt, or measure what its heads do.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", metavar="DIR", type=Path,
                        help="run directory to load (default: the most recently trained run under runs/)")
    parser.add_argument("--prompt", metavar="TEXT", help="the text whose attention is drawn")
    parser.add_argument("--out", metavar="PNG", type=Path, default=Path("attention.png"),
                        help="where the figure is written (default: %(default)s)")
    parser.add_argument("--layer", type=int, metavar="L", help="with --head: draw only this layer's head, large")
    parser.add_argument("--head", type=int, metavar="H", help="with --layer: the head to draw")
    parser.add_argument("--json", action="store_true",
                        help="print the weights and the token pieces as JSON instead of drawing")
    parser.add_argument("--compare-init", action="store_true",
                        help="draw an untrained model of the same shape beside the trained one")
    parser.add_argument("--roles", action="store_true",
                        help="print each head's previous-token, first-token, entropy and induction scores")
    parser.add_argument("--text-file", metavar="PATH", type=Path,
                        help="with --roles: held-out UTF-8 text to score (default: the run's validation split)")
    parser.add_argument("--windows", type=int, default=8, metavar="N",
                        help="with --roles: windows of held-out text (and of repeated random tokens) scored "
                        "(default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_command(build_parser(), argv, _attention)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _attention(args: argparse.Namespace) -> int:
    _check_flags(args)
    device = select_device(args.device, setting="--device")
    run = load_run(args.run if args.run is not None else find_latest_run(), device)
    if args.roles:
        windows = _held_out_windows(run, args.text_file, args.windows)
        print(format_roles(head_roles(run.model, windows)))
        return 0
    ids = run.tokenizer.encode(args.prompt, add_special_tokens=False).ids
    if len(ids) > run.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the model's {run.block_size}-token "
                        "context; shorten it")
    _check_layer_head(args, run)
    idx = torch.tensor([ids], device=device)
    maps = [layer[0] for layer in attention_maps(run.model, idx)]
    tokens = [run.token_bytes[i].decode("utf-8", errors="replace") for i in ids]
    if args.json:
        print(json.dumps({"run": str(run.directory), "tokens": tokens, "token_ids": ids,
                          "weights": [layer.tolist() for layer in maps]}, ensure_ascii=False))
        return 0
    _check_writable(args.out)
    try:
        if args.layer is not None:
            draw_attention_map(maps[args.layer][args.head], tokens, args.out,
                               title=f"{run.directory.name}: layer {args.layer} head {args.head}")
        else:
            compare = _untrained_maps(run, idx) if args.compare_init else None
            title = f"{run.directory.name}: attention over the prompt"
            draw_attention_grid(maps, tokens, args.out, title=title, compare=compare,
                                compare_title="untrained")
    except OSError as error:
        raise UserError(f"cannot write the figure: {describe_os_error(error, args.out)}") from None
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    if args.roles:
        if args.prompt is not None or args.json or args.compare_init or args.layer is not None:
            raise UserError("--roles prints a table of every head; leave out --prompt, --json, --compare-init "
                            "and --layer/--head")
        if args.windows < 1:
            raise UserError(f"--windows must be at least 1, got {args.windows}")
        return
    if args.text_file is not None:
        raise UserError("--text-file goes with --roles")
    if not args.prompt:
        raise UserError('give the text to draw with --prompt, e.g. --prompt "ROMEO: But soft" (or use --roles)')
    if (args.layer is None) != (args.head is None):
        raise UserError("--layer and --head go together: give both to draw one head, or neither for all")
    if args.layer is not None and args.compare_init:
        raise UserError("--compare-init draws every head; leave out --layer and --head")


def _check_layer_head(args: argparse.Namespace, run: LoadedRun) -> None:
    cfg = run.model.config
    if args.layer is not None and not 0 <= args.layer < cfg.n_layer:
        raise UserError(f"--layer {args.layer} is out of range: the model has layers 0..{cfg.n_layer - 1}")
    if args.head is not None and not 0 <= args.head < cfg.n_head:
        raise UserError(f"--head {args.head} is out of range: the model has heads 0..{cfg.n_head - 1}")


def _check_writable(out: Path) -> None:
    """Refuse an --out that cannot be written before any work is done."""
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name such as {out / 'attention.png'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--out {out}: the folder {parent} does not exist; create it or choose another path")


def _untrained_maps(run: LoadedRun, idx: torch.Tensor) -> list[torch.Tensor]:
    """The maps of a freshly initialised model of the run's shape (seed 0)."""
    torch.manual_seed(0)
    untrained = type(run.model)(run.model.config).to(idx.device)
    return [layer[0] for layer in attention_maps(untrained, idx)]


def _held_out_windows(run: LoadedRun, text_file: Path | None, count: int) -> torch.Tensor:
    """(count, block_size) windows of held-out tokens, back to back from the start."""
    if text_file is not None:
        try:
            text = text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"cannot read --text-file {text_file}: {error}; give a UTF-8 text file") from None
        tokens = np.asarray(run.tokenizer.encode(text, add_special_tokens=False).ids)
        source = f"--text-file {text_file}"
    else:
        tokens = _validation_tokens(run)
        source = "the run's validation split"
    T = run.block_size
    count = min(count, len(tokens) // T)
    if count < 1:
        raise UserError(f"{source} has fewer than {T} tokens (one window); give a longer --text-file")
    windows = np.asarray(tokens[:count * T], dtype=np.int64).reshape(count, T)
    return torch.from_numpy(windows).to(run.device)


def _validation_tokens(run: LoadedRun) -> np.ndarray:
    """The run's held-out text, tokenized by its own tokenizer (prepared and cached like training's)."""
    from common.config import build
    from data import DataConfig, prepare_data

    if not (run.directory / CONFIG_FILE).is_file():
        raise UserError(f"{run.directory} has no {CONFIG_FILE} to find its validation text; pass --text-file")
    data = build(DataConfig, read_config(run.directory).get("data") or {}, "data")
    if data.format != "text":
        raise UserError(f"{run.directory} was trained on {data.format} data; pass held-out plain text "
                        "with --text-file")
    prepared = prepare_data(data, progress=False, tokenizer_file=run.directory / TOKENIZER_FILE)
    return np.asarray(prepared.val_tokens())
