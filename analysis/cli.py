"""The ``attention.py`` command line: draw a run's attention maps (one head with and without the
1/√d scale, or one layer of several runs side by side), print its heads' roles, score which head
copies a span a prompt repeats, or show how its attention changed over training.

Flags are checked and the runs loaded before anything is written, so a failed command leaves no
file behind.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from analysis.history import INDUCTION_THRESHOLD, format_history, has_repeat_loss, read_attention_history
from analysis.maps import (
    MIN_COUNT,
    MIN_PERIOD,
    attention_maps,
    copy_roles,
    describe_attention,
    find_repeat,
    format_copy_roles,
    format_roles,
    head_roles,
    induction_periods,
    probe_ids,
    scale_comparison,
)
from analysis.plot import (
    FIGURE_FORMATS,
    draw_attention_grid,
    draw_attention_history,
    draw_attention_map,
    draw_attention_rows,
    draw_copy_heads,
    draw_induction_history,
    draw_scale_comparison,
)
from common.cli import ArgumentParser, path_arg, run_command
from common.device import select_device
from common.threads import add_threads_argument, parse_threads, use_threads
from common.errors import UserError
from common.os_errors import describe_os_error
from inference.terminal import decode_argument
from rundir.files import METRICS_FILE
from rundir.loading import LoadedRun, find_latest_run, load_run, validation_tokens

_EPILOG = """\
examples:
  python attention.py --run runs/tiny --prompt "ROMEO: But soft, what light" --out attention.png
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --layer 1 --head 0 --out head.png
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --compare-init --out init.png
  python attention.py --run runs/tiny --prompt "ROMEO:" --json > weights.json
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --layer 1 --head 0 --compare-scale --out scale.png
  python attention.py --run runs/tiny --roles
  python attention.py --run runs/tool_lab/s1337/grpo --copy 281764 --out copy.png \
      --prompt '<|user|>What is 347*812?<|end|><|assistant|><|call|>calculator{"expression":"347*812"}<|end|><|tool|>281764<|end|><|assistant|>281764<|end|>'
  python attention.py --run runs/tiny --history --out history.png
  python attention.py --runs runs/mha runs/gqa runs/mla --prompt "ROMEO: But soft" --layer 3 --out variants.png
"""
DEFAULT_OUT = Path("attention.png")
DEFAULT_WINDOWS = 8
# Every window is a forward pass whose attention maps are held at once, and --text-file is read up
# to what the windows need: the bound keeps both finite.
MAX_WINDOWS = 1024
# Tokens of a --text-file read at least, whatever the windows: the probe keeps ids seen MIN_COUNT
# times, which needs more text than a few windows hold.
PROBE_TOKENS = 200_000


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="attention.py",
        description="Draw the attention weights of a trained run over a prompt, or measure what its heads do.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", metavar="DIR", type=path_arg,
                        help="run directory to load (default: the most recently trained run under runs/)")
    parser.add_argument("--prompt", metavar="TEXT", help="the text whose attention is drawn")
    parser.add_argument("--runs", metavar="DIR", type=path_arg, nargs="+",
                        help="draw one layer (--layer) of each of these runs over the same --prompt, one row per "
                        "run labelled with its attention kind; the runs must split the prompt alike")
    parser.add_argument("--out", metavar="FILE", type=path_arg,
                        help=f"where the figure is written, as {', '.join('.' + s for s in FIGURE_FORMATS)} by "
                        f"its suffix (default: {DEFAULT_OUT}; with --history, no figure unless given)")
    parser.add_argument("--layer", type=int, metavar="L",
                        help="with --head: draw only this layer's head, large; with --runs: the layer drawn")
    parser.add_argument("--head", type=int, metavar="H", help="with --layer: the head to draw")
    parser.add_argument("--json", action="store_true",
                        help="print the weights and the token pieces as JSON instead of drawing")
    parser.add_argument("--compare-init", action="store_true",
                        help="draw an untrained model of the same shape beside the trained one")
    parser.add_argument("--compare-scale", action="store_true",
                        help="with --layer and --head: draw the head's weights with the 1/sqrt(d) scale (as the "
                        "model computes them) beside those of the same scores without it")
    parser.add_argument("--roles", action="store_true",
                        help="print each head's previous-token, first-token, entropy and induction scores")
    parser.add_argument("--copy", metavar="TEXT",
                        help="with --prompt: print each head's copy and induction scores where the prompt writes "
                        "TEXT a second time (a tool's result repeated as the answer, say); with --out, draw the "
                        "head that copies most beside the one that copies least")
    parser.add_argument("--text-file", metavar="PATH", type=path_arg,
                        help="with --roles: held-out UTF-8 text to score (default: the run's validation split)")
    parser.add_argument("--windows", type=int, metavar="N",
                        help="with --roles: windows of held-out text (and of repeated random tokens) scored "
                        f"(default: {DEFAULT_WINDOWS})")
    parser.add_argument("--history", action="store_true",
                        help="print each evaluation's attention entropy per layer and best induction score from "
                        "the run's metrics.jsonl, and the first step an induction head appeared at; with --out, "
                        "draw them")
    parser.add_argument("--induction-threshold", type=float, metavar="X",
                        help=f"with --history: the induction score a head must reach (default: {INDUCTION_THRESHOLD}, "
                        "half its weight on the predicted token)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: %(default)s)")
    add_threads_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_command(build_parser(), argv, _attention)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _attention(args: argparse.Namespace) -> int:
    _check_flags(args)
    if args.history:
        return _history(args)
    device = select_device(args.device, setting="--device")
    use_threads(parse_threads(args.threads))
    if args.runs is not None:
        return _draw_runs(args, device)
    run = load_run(args.run if args.run is not None else find_latest_run(), device)
    if args.roles:
        count = args.windows or DEFAULT_WINDOWS
        tokens, source = _held_out_tokens(run, args.text_file, count)
        windows = _held_out_windows(run, tokens, source, count)
        ids = probe_ids(tokens, skip=[run.eot_id])
        periods = induction_periods(run.block_size, len(ids))
        if not periods:
            raise UserError(f"{source} holds {len(ids)} distinct tokens seen {MIN_COUNT} times or more; the induction "
                            f"probe repeats at least {MIN_PERIOD} distinct ones (in a context of at least "
                            f"{2 * MIN_PERIOD}): give a longer, more varied --text-file")
        print(format_roles(head_roles(run.model, windows, ids)))
        print(f"\ninduction: repeats of {len(ids)} distinct ids (each seen {MIN_COUNT}+ times) from {source}, at periods "
              f"{', '.join(map(str, periods))}")
        return 0
    ids = _prompt_ids(run, args.prompt)
    _check_layer_head(args, run)
    idx = torch.tensor([ids], device=device)
    tokens = _pieces(run, ids)
    if args.copy is not None:
        return _copy(args, run, ids, idx, tokens)
    if args.compare_scale:
        return _draw_scale(args, run, idx, tokens)
    maps = [layer[0] for layer in attention_maps(run.model, idx)]
    if args.json:
        print(json.dumps({"run": str(run.directory), "tokens": tokens, "token_ids": ids,
                          "weights": [layer.tolist() for layer in maps]}, ensure_ascii=False))
        return 0
    out = _writable_out(args)
    with _writing_figure(out):
        if args.layer is not None:
            draw_attention_map(maps[args.layer][args.head], tokens, out,
                               title=f"{run.directory.name}: layer {args.layer} head {args.head}")
        else:
            compare = _untrained_maps(run, idx) if args.compare_init else None
            title = f"{run.directory.name}: attention over the prompt"
            draw_attention_grid(maps, tokens, out, title=title, compare=compare,
                                compare_title="untrained (same shape, seed 0)")
    return 0


def _draw_scale(args: argparse.Namespace, run: LoadedRun, idx: torch.Tensor, tokens: list[str]) -> int:
    """Experiment 2: one head's weights with the 1/√d scale and without it, from the same scores."""
    comparison = scale_comparison(run.model, idx, args.layer, args.head)
    scaled_bits, unscaled_bits = comparison.entropy_bits()
    print(f"layer {args.layer} head {args.head} (d = {comparison.head_dim}): mean attention entropy "
          f"{scaled_bits:.3f} bits with the 1/sqrt(d) scale, {unscaled_bits:.3f} bits without")
    out = _writable_out(args)
    with _writing_figure(out):
        draw_scale_comparison(comparison, tokens, out,
                              title=f"{run.directory.name}: layer {args.layer} head {args.head}, with and "
                              "without the 1/√d scale")
    return 0


def _copy(args: argparse.Namespace, run: LoadedRun, ids: list[int], idx: torch.Tensor, tokens: list[str]) -> int:
    """Which head copies a span the prompt writes twice: every head's copy and induction scores at
    the second copy's positions, and (with --out) the most and the least copying heads' maps."""
    span = run.tokenizer.encode(args.copy, add_special_tokens=False).ids
    repeat = find_repeat(ids, span) if span else None
    if repeat is None:
        raise UserError(f"--copy {args.copy!r} ({len(span)} tokens) does not occur twice in the prompt's tokens; give "
                        "text the prompt writes twice, as it is written there")
    if args.out is not None:
        _check_writable(args.out)
    roles = copy_roles(run.model, idx, repeat)
    print(format_copy_roles(roles))
    print(f"\ncopy: {args.copy!r}, tokens {repeat.offset}-{repeat.offset + repeat.length - 1} written again at "
          f"{repeat.offset + repeat.period}-{repeat.offset + repeat.period + repeat.length - 1}")
    if args.out is not None:
        ranked = sorted(roles, key=lambda r: r.copy)
        maps = attention_maps(run.model, idx)
        heads = [ranked[-1], ranked[0]]  # the strongest copier, and a control that does not copy
        with _writing_figure(args.out):
            draw_copy_heads([maps[r.layer][0, r.head] for r in heads],
                            [f"layer {r.layer} head {r.head}: copy {r.copy:.2f}, induction {r.induction:.2f}"
                             for r in heads], tokens, repeat, args.out,
                            title=f"{run.directory.name}: which head copies {args.copy!r}")
    return 0


def _history(args: argparse.Namespace) -> int:
    """Experiment 4: the run's logged attention statistics, and when an induction head appeared."""
    run_dir = args.run if args.run is not None else find_latest_run()
    threshold = INDUCTION_THRESHOLD if args.induction_threshold is None else args.induction_threshold
    if args.out is not None:
        _check_writable(args.out)
    history, skipped = read_attention_history(run_dir)
    if skipped:
        print(f"warning: skipped {skipped} evaluation record(s) of {run_dir / METRICS_FILE} whose attention "
              "statistics are not numbers or miss a layer", file=sys.stderr)
    print(format_history(history, threshold))
    if args.out is not None:
        draw = draw_induction_history if has_repeat_loss(history) else draw_attention_history
        with _writing_figure(args.out):
            draw(history, args.out, threshold=threshold, title=f"{run_dir.name}: attention at each evaluation")
    return 0


def _draw_runs(args: argparse.Namespace, device: torch.device) -> int:
    """Experiment 5: one layer of each run over the same prompt, one row per run."""
    runs = [load_run(directory, device) for directory in args.runs]
    ids = _prompt_ids(runs[0], args.prompt)
    for run in runs:
        _check_layer_head(args, run)
        if _prompt_ids(run, args.prompt) != ids or _pieces(run, ids) != _pieces(runs[0], ids):
            raise UserError(f"{runs[0].directory} and {run.directory} split the prompt into different tokens "
                            "(their tokenizers differ); --runs compares runs that share a tokenizer")
    out = _writable_out(args)
    idx = torch.tensor([ids], device=device)
    heads = [args.head] if args.head is not None else range(max(run.model.config.n_head for run in runs))
    rows = []
    for run in runs:
        layer = attention_maps(run.model, idx)[args.layer][0]
        if args.head is not None:
            layer = layer[args.head:args.head + 1]
        # The run and its kind on lines of their own: a kind with its positions is as wide as a map.
        rows.append((f"{run.directory.name}\n{describe_attention(run.model.config)}", layer))
    with _writing_figure(out):
        draw_attention_rows(rows, _pieces(runs[0], ids), out, title=f"layer {args.layer} over {args.prompt!r}",
                            head_names=[f"layer {args.layer} head {h}" for h in heads])
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    modes = [flag for flag, on in (("--roles", args.roles), ("--history", args.history),
                                   ("--runs", args.runs is not None)) if on]
    if len(modes) > 1:
        raise UserError(f"{modes[0]} and {modes[1]} are separate commands; give one of them")
    if args.windows is not None and not 1 <= args.windows <= MAX_WINDOWS:
        raise UserError(f"--windows must be from 1 to {MAX_WINDOWS}, got {args.windows}")
    threshold = args.induction_threshold
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise UserError(f"--induction-threshold is a weight in (0, 1], got {threshold}")
    if args.roles:
        _refuse(args, "--roles prints a table of every head", "--prompt", "--json", "--compare-init",
                "--compare-scale", "--layer", "--head", "--out", "--induction-threshold", "--copy")
        return
    if args.history:
        _refuse(args, "--history reads the run's metrics.jsonl", "--prompt", "--json", "--compare-init",
                "--compare-scale", "--layer", "--head", "--text-file", "--windows", "--copy")
        return
    _refuse(args, "--text-file and --windows go with --roles", "--text-file", "--windows")
    _refuse(args, "--induction-threshold goes with --history", "--induction-threshold")
    if not args.prompt:
        raise UserError('give the text to draw with --prompt, e.g. --prompt "ROMEO: But soft" (or use --roles)')
    args.prompt = decode_argument(args.prompt, "--prompt")
    if args.copy is not None:
        _refuse(args, "--copy scores every head on the prompt", "--runs", "--json", "--compare-init", "--compare-scale",
                "--layer", "--head")
        if not args.copy:
            raise UserError("--copy is empty; give the text the prompt writes twice, e.g. --copy 281764")
        args.copy = decode_argument(args.copy, "--copy")
        return
    if args.runs is not None:
        _refuse(args, "--runs draws one layer of each run given to it", "--run", "--json", "--compare-init",
                "--compare-scale")
        if args.layer is None:
            raise UserError("--runs draws one layer of each run: give it with --layer (and --head for one head)")
        return
    if (args.layer is None) != (args.head is None):
        raise UserError("--layer and --head go together: give both to draw one head, or neither for all")
    if args.compare_init:
        _refuse(args, "--compare-init draws every head", "--layer", "--head", "--compare-scale")
    if args.compare_scale:
        _refuse(args, "--compare-scale draws one figure", "--json")
        if args.layer is None:
            raise UserError("--compare-scale draws one head: give it with --layer and --head")
    if args.json:
        _refuse(args, "--json prints every layer's weights instead of drawing", "--out", "--compare-init",
                "--layer", "--head")


def _refuse(args: argparse.Namespace, what: str, *flags: str) -> None:
    """A UserError naming the ``flags`` given that do not go with ``what``."""
    values = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in flags}
    given = [flag for flag, value in values.items() if value is not None and value is not False]  # 0 is given
    if given:
        raise UserError(f"{what}; leave out {', '.join(given)}")


def _prompt_ids(run: LoadedRun, prompt: str) -> list[int]:
    ids = run.tokenizer.encode(prompt, add_special_tokens=False).ids
    if len(ids) > run.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the {run.block_size}-token context of "
                        f"{run.directory}; shorten it")
    return ids


def _pieces(run: LoadedRun, ids: list[int]) -> list[str]:
    """The text of each token, for the axes (a piece of a multi-byte character shows as U+FFFD)."""
    return [run.token_bytes[i].decode("utf-8", errors="replace") for i in ids]


def _check_layer_head(args: argparse.Namespace, run: LoadedRun) -> None:
    cfg = run.model.config
    if args.layer is not None and not 0 <= args.layer < cfg.n_layer:
        raise UserError(f"--layer {args.layer} is out of range: {run.directory} has layers 0..{cfg.n_layer - 1}")
    if args.head is not None and not 0 <= args.head < cfg.n_head:
        raise UserError(f"--head {args.head} is out of range: {run.directory} has heads 0..{cfg.n_head - 1}")


def _writable_out(args: argparse.Namespace) -> Path:
    out = DEFAULT_OUT if args.out is None else args.out
    _check_writable(out)
    return out


def _check_writable(out: Path) -> None:
    """Refuse an --out that cannot be written before any work is done."""
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name such as {out / 'attention.png'}")
    if out.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise UserError(f"--out {out}: the suffix names the figure's format; end the name with "
                        f"{', '.join('.' + s for s in FIGURE_FORMATS)}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--out {out}: the folder {parent} does not exist; create it or choose another path")


@contextmanager
def _writing_figure(out: Path) -> Iterator[None]:
    """Turn a failure to write ``out`` into a one-line error; say where the figure went."""
    try:
        yield
    except OSError as error:
        raise UserError(f"cannot write the figure: {describe_os_error(error, out)}") from None
    print(f"wrote {out}", file=sys.stderr)


def _untrained_maps(run: LoadedRun, idx: torch.Tensor) -> list[torch.Tensor]:
    """The maps of a freshly initialised model of the run's shape (seed 0)."""
    torch.manual_seed(0)
    untrained = type(run.model)(run.model.config).to(idx.device)
    return [layer[0] for layer in attention_maps(untrained, idx)]


def _held_out_tokens(run: LoadedRun, text_file: Path | None, count: int) -> tuple[np.ndarray, str]:
    """The held-out tokens --roles scores, and where they came from: the --text-file, tokenized by the
    run's tokenizer, or the run's validation split. Of a file, only what ``count`` windows and the
    probe's id counts need is read."""
    if text_file is None:
        return validation_tokens(run, "pass --text-file"), "the run's validation split"
    tokens = max(count * run.block_size, PROBE_TOKENS)
    text = _read_text_prefix(text_file, tokens * max(map(len, run.token_bytes)))
    return np.asarray(run.tokenizer.encode(text, add_special_tokens=False).ids), f"--text-file {text_file}"


def _held_out_windows(run: LoadedRun, tokens: np.ndarray, source: str, count: int) -> torch.Tensor:
    """(count, block_size) windows of held-out tokens, back to back from the start."""
    T = run.block_size
    count = min(count, len(tokens) // T)
    if count < 1:
        raise UserError(f"{source} has fewer than {T} tokens (one window); give a longer --text-file")
    windows = np.asarray(tokens[:count * T], dtype=np.int64).reshape(count, T)
    return torch.from_numpy(windows).to(run.device)


def _read_text_prefix(text_file: Path, max_bytes: int) -> str:
    """At most the first ``max_bytes`` bytes of ``text_file`` as text. No token is longer than the
    longest token's bytes, so that many bytes per token needed always suffice, and a file with no
    end (a pipe, /dev/zero) is never read whole."""
    try:
        with open(text_file, "rb") as f:
            data = f.read(max_bytes)
        # Not final: a character cut by the bound is dropped, not refused.
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read --text-file {text_file}: {error}; give a UTF-8 text file") from None
