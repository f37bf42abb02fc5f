"""The ``attention.py`` command line, a subcommand per mode (``COMMANDS``). Flags are checked and the
runs loaded before anything is written, so a failed command leaves no file behind."""

import argparse
import codecs
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from analysis.history import INDUCTION_THRESHOLD, format_history, has_repeat_loss, read_attention_history
from analysis.maps import (copy_roles, describe_attention, find_repeat, format_copy_roles, format_roles, head_roles,
                           scale_comparison)
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
from analysis.roles import MIN_COUNT, MIN_PERIOD, attention_maps, induction_periods, probe_ids
from common.cli import ArgumentParser, path_arg, run_command
from common.device import select_device
from common.threads import add_threads_argument, parse_threads, use_threads
from common.errors import UserError, describe_os_error
from inference.terminal import decode_argument
from rundir.files import METRICS_FILE
from rundir.loading import LoadedRun, find_latest_run, load_run, validation_tokens

_EPILOG = """\
examples:
  python attention.py --run runs/tiny --prompt "ROMEO: But soft, what light" --out attention.png
  python attention.py --run runs/tiny --prompt "ROMEO: But soft" --layer 1 --head 0 --compare-scale --out scale.png
  python attention.py --run runs/tiny --roles
  python attention.py --run runs/tiny --history --out history.png
  python attention.py --runs runs/mha runs/gqa runs/mla --prompt "ROMEO: But soft" --layer 3 --out variants.png
  python attention.py --run runs/tool_lab/s1337/grpo --prompt "$CONVERSATION" --copy 308976 --out copy.png
"""
FORMATS = ", ".join("." + suffix for suffix in FIGURE_FORMATS)
# Every window is a forward pass whose attention maps are held at once, and --text-file is read up
# to what the windows need: the bound keeps both finite.
MAX_WINDOWS = 1024
# Tokens of a --text-file read at least, whatever the windows: the probe keeps ids seen MIN_COUNT
# times, which needs more text than a few windows hold.
PROBE_TOKENS = 200_000


# Each mode is a subcommand with only its own flags. The documented forms name the mode by a flag
# (``attention.py --roles``): the first of these given picks it, and a command with none draws the grid.
MODE_FLAGS = {"--roles": "roles", "--history": "history", "--runs": "runs", "--copy": "copy",
              "--compare-scale": "scale", "--json": "json", "--layer": "head", "--head": "head"}
VALUED = {"--runs", "--copy", "--layer", "--head"}  # mode flags that stay, holding their values


class _Parser(ArgumentParser):
    """The top-level parser: it reads a documented flag form as its subcommand (``as_command``)."""

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(as_command(sys.argv[1:] if args is None else list(args)), namespace)
        if extra:
            raise UserError(f"attention.py {parsed.command} does not take {' '.join(extra)}; see python attention.py "
                            f"{parsed.command} --help")
        return parsed


def as_command(argv: list[str]) -> list[str]:
    """``argv`` with its subcommand first: a documented form's mode flag names it (``MODE_FLAGS``)."""
    if argv and argv[0] in COMMANDS or argv[:1] in (["-h"], ["--help"]):
        return argv
    given = {arg.split("=", 1)[0] for arg in argv}
    flag = next((flag for flag in MODE_FLAGS if flag in given), None)
    return [MODE_FLAGS.get(flag, "draw"), *(arg for arg in argv if arg != flag or flag in VALUED)]


def _text(flag: str, example: str) -> Callable[[str], str]:
    """An argparse ``type`` for text from the command line: not empty, and UTF-8."""
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"is empty; give the text, e.g. {flag} {example}")
        return decode_argument(text, flag)
    return parse


def _windows(text: str) -> int:
    if not 1 <= int(text) <= MAX_WINDOWS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_WINDOWS}, got {text!r}")
    return int(text)


def _weight(text: str) -> float:
    if not 0.0 < float(text) <= 1.0:  # nan compares as nothing: refused too
        raise argparse.ArgumentTypeError(f"is a weight in (0, 1], got {text!r}")
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attention.py", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Draw a trained run's attention over a prompt, or measure what its heads do; each "
                     "mode is a subcommand (attention.py roles --help), which the flag forms below name.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for name, (run_help, handler) in COMMANDS.items():
        sub = commands.add_parser(name, help=run_help, description=run_help, allow_abbrev=False)
        sub.set_defaults(handler=handler)
        if name != "runs":
            sub.add_argument("--run", metavar="DIR", type=path_arg,
                             help="run directory to load (default: the most recently trained run under runs/)")
        if name not in ("roles", "history"):
            sub.add_argument("--prompt", metavar="TEXT", required=True, type=_text("--prompt", '"ROMEO: But soft"'),
                             help="the text whose attention is drawn")
        if name not in ("json", "roles"):
            sub.add_argument("--out", metavar="FILE", type=path_arg,
                             default=None if name in ("copy", "history") else Path("attention.png"),
                             help=f"where the figure is written, as {FORMATS} by its suffix (default: %(default)s)")
        if name in ("head", "scale", "runs"):
            sub.add_argument("--layer", type=int, metavar="L", required=True, help="the layer drawn")
            sub.add_argument("--head", type=int, metavar="H", required=name != "runs",
                             help="the head drawn" + (" (default: every head)" if name == "runs" else ""))
        if name != "history":
            sub.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: %(default)s)")
            add_threads_argument(sub)
    draw, roles, copy, history, runs = (commands.choices[name] for name in ("draw", "roles", "copy", "history", "runs"))
    draw.add_argument("--compare-init", action="store_true",
                      help="draw an untrained model of the same shape beside the trained one")
    roles.add_argument("--text-file", metavar="PATH", type=path_arg,
                       help="held-out UTF-8 text to score (default: the run's validation split)")
    roles.add_argument("--windows", type=_windows, metavar="N", default=8,
                       help="windows of held-out text (and of repeated random tokens) scored (default: %(default)s)")
    copy.add_argument("--copy", metavar="TEXT", required=True, type=_text("--copy", "281764"),
                      help="the text the prompt writes a second time (a tool's result repeated as the answer, say)")
    history.add_argument("--induction-threshold", type=_weight, metavar="X", default=INDUCTION_THRESHOLD,
                         help="the induction score a head must reach (default: %(default)s, half its weight)")
    runs.add_argument("--runs", metavar="DIR", type=path_arg, nargs="+", required=True,
                      help="the runs drawn, a row each, labelled with its attention kind; they split the prompt alike")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_command(build_parser(), argv, lambda args: args.handler(args))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _device(args: argparse.Namespace) -> torch.device:
    use_threads(parse_threads(args.threads))
    return select_device(args.device, setting="--device")


def _loaded(args: argparse.Namespace) -> tuple[LoadedRun, torch.device]:
    device = _device(args)
    return load_run(args.run if args.run is not None else find_latest_run(), device), device


def _prompt(args: argparse.Namespace) -> tuple[LoadedRun, list[int], torch.Tensor, list[str]]:
    """The run, and ``--prompt`` as its ids, a batch of one and its pieces, checked to fit the run."""
    run, device = _loaded(args)
    ids = _prompt_ids(run, args.prompt)
    _check_layer_head(args, run)
    return run, ids, torch.tensor([ids], device=device), _pieces(run, ids)


def _draw(args: argparse.Namespace) -> int:
    run, _, idx, tokens = _prompt(args)
    out = _writable(args.out)
    maps = [layer[0] for layer in attention_maps(run.model, idx)]
    with _writing_figure(out):
        if args.command == "head":
            draw_attention_map(maps[args.layer][args.head], tokens, out,
                               title=f"{run.directory.name}: layer {args.layer} head {args.head}")
        else:
            draw_attention_grid(maps, tokens, out, title=f"{run.directory.name}: attention over the prompt",
                                compare=_untrained_maps(run, idx) if args.compare_init else None,
                                compare_title="untrained (same shape, seed 0)")
    return 0


def _json(args: argparse.Namespace) -> int:
    run, ids, idx, tokens = _prompt(args)
    print(json.dumps({"run": str(run.directory), "tokens": tokens, "token_ids": ids,
                      "weights": [layer[0].tolist() for layer in attention_maps(run.model, idx)]}, ensure_ascii=False))
    return 0


def _roles(args: argparse.Namespace) -> int:
    run, _ = _loaded(args)
    tokens, source = _held_out_tokens(run, args.text_file, args.windows)
    windows = _held_out_windows(run, tokens, source, args.windows)
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


def _scale(args: argparse.Namespace) -> int:
    run, _, idx, tokens = _prompt(args)
    comparison = scale_comparison(run.model, idx, args.layer, args.head)
    scaled_bits, unscaled_bits = comparison.entropy_bits()
    out = _writable(args.out)
    print(f"layer {args.layer} head {args.head} (d = {comparison.head_dim}): mean attention entropy "
          f"{scaled_bits:.3f} bits with the 1/sqrt(d) scale, {unscaled_bits:.3f} bits without")
    with _writing_figure(out):
        draw_scale_comparison(comparison, tokens, out,
                              title=f"{run.directory.name}: layer {args.layer} head {args.head}, with and "
                              "without the 1/√d scale")
    return 0


def _copy(args: argparse.Namespace) -> int:
    run, ids, idx, tokens = _prompt(args)
    span = run.tokenizer.encode(args.copy, add_special_tokens=False).ids
    repeat = find_repeat(ids, span) if span else None
    if repeat is None:
        raise UserError(f"--copy {args.copy!r} ({len(span)} tokens) does not occur twice in the prompt's tokens; give "
                        "text the prompt writes twice, as it is written there")
    _writable(args.out)
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
    run_dir = args.run if args.run is not None else find_latest_run()
    _writable(args.out)
    history, skipped = read_attention_history(run_dir)
    if skipped:
        print(f"warning: skipped {skipped} evaluation record(s) of {run_dir / METRICS_FILE} whose attention "
              "statistics are not numbers or miss a layer", file=sys.stderr)
    print(format_history(history, args.induction_threshold))
    if args.out is not None:
        draw = draw_induction_history if has_repeat_loss(history) else draw_attention_history
        with _writing_figure(args.out):
            draw(history, args.out, threshold=args.induction_threshold,
                 title=f"{run_dir.name}: attention at each evaluation")
    return 0


def _runs(args: argparse.Namespace) -> int:
    device = _device(args)
    runs = [load_run(directory, device) for directory in args.runs]
    ids = _prompt_ids(runs[0], args.prompt)
    for run in runs:
        _check_layer_head(args, run)
        if _prompt_ids(run, args.prompt) != ids or _pieces(run, ids) != _pieces(runs[0], ids):
            raise UserError(f"{runs[0].directory} and {run.directory} split the prompt into different tokens "
                            "(their tokenizers differ); --runs compares runs that share a tokenizer")
    out = _writable(args.out)
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


# Each subcommand: what it does (its help) and the function that does it.
COMMANDS = {
    "draw": ("draw every head's weights over --prompt", _draw),
    "head": ("draw one head (--layer, --head) over --prompt, large", _draw),
    "json": ("print the weights and the token pieces over --prompt as JSON", _json),
    "scale": ("draw one head's weights with and without the 1/sqrt(d) scale, and print each one's entropy", _scale),
    "roles": ("print each head's previous-token, first-token, entropy and induction scores", _roles),
    "copy": ("print each head's copy and induction scores where --prompt writes --copy twice (--out: draw two)", _copy),
    "history": ("print (--out: draw) the attention statistics the run logged and when an induction head appeared",
                _history),
    "runs": ("draw one layer (--layer) of each of several runs over the same --prompt", _runs),
}


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
    cfg, layer, head = run.model.config, getattr(args, "layer", None), getattr(args, "head", None)
    if layer is not None and not 0 <= layer < cfg.n_layer:
        raise UserError(f"--layer {layer} is out of range: {run.directory} has layers 0..{cfg.n_layer - 1}")
    if head is not None and not 0 <= head < cfg.n_head:
        raise UserError(f"--head {head} is out of range: {run.directory} has heads 0..{cfg.n_head - 1}")


def _writable(out: Path | None) -> Path | None:
    """``out``, refused before any work is done when it cannot be written (None: no figure)."""
    if out is None:
        return None
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name such as {out / 'attention.png'}")
    if out.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise UserError(f"--out {out}: the suffix names the figure's format; end the name with {FORMATS}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--out {out}: the folder {parent} does not exist; create it or choose another path")
    return out


@contextmanager
def _writing_figure(out: Path) -> Iterator[None]:
    """Turn a failure to write ``out`` into a one-line error; say where the figure went."""
    try:
        yield
    except OSError as error:
        raise UserError(f"cannot write the figure: {describe_os_error(error, out)}") from None
    print(f"wrote {out}", file=sys.stderr)


def _untrained_maps(run: LoadedRun, idx: torch.Tensor) -> list[torch.Tensor]:
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
