"""Attention kinds side by side: configs/tiny.yaml trained once per variant, at equal wall time, on
the same data and seed, then measured for quality, cache size and decode speed.

    python -m benchmarks.attention_variants --minutes 10 --seeds 1337 1338 --plot docs/attention_variants.png
    python -m benchmarks.attention_variants --minutes 0.1 --set eval.final_max_batches=4   # a quick check
    python -m benchmarks.attention_variants --forms                         # MLA: expanded vs absorbed
    python -m benchmarks.attention_variants --positions learned rope none --seeds 1337 1338 1339 \
        --minutes 2 --plot docs/positions-extrapolation.png                 # the positions axis
    python -m benchmarks.attention_variants --positions learned rope none --steps 400   # at equal steps

Variants: MHA (n_kv_head = n_head), GQA as the config ships it, MQA (n_kv_head = 1), and multi-head
latent attention at two latent sizes (``--latents``). Each one is a real ``train.py`` run (in
``--out``/<variant>-s<seed>) whose training clock is ``--minutes`` (train.max_minutes; the
final validation pass over the whole split comes after it), or, with ``--steps``, whose budget is a
number of steps: on a machine shared with other work a clock buys each run a different number of
steps, and equal steps compare the same work. The markdown table is ``variants_table``'s; the figure
plots bits/byte against KV bytes per token, one labelled point per variant.

``--positions KIND ...`` trains the positions axis instead: the config's attention (grouped-query as
tiny.yaml ships it, value embeddings off) once per kind of positions (learned, rope, none) and seed.
It prints three tables: quality at equal time (``positions_table``); length extrapolation, bits/byte
of the same ``--eval-windows`` validation windows cut at each of ``--lengths`` times the trained
context (``extrapolation_table``); and each head's first-token (sink) score over ``--sink-windows``
windows (``first_token_table``). The figure is bits/byte against evaluation length (``plot_extrapolation``).

``--forms`` times one latent-attention layer of the tiny shape in both forms (``model.gpt.LatentAttention``):
a training step (forward + backward over a batch of whole windows) and a one-token decode step
at full context. It is how the model's choice of form for each case was made."""

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from analysis.maps import describe_attention
from analysis.positions import (
    LengthScore,
    bits_per_byte_at_lengths,
    even_spread_first_token,
    first_token_attention,
    scored_span,
)
from benchmarks.shared import (
    ROOT, add_set_flag, benchmark_parser, final_eval, in_turns, mean_std, run_train_py, table, table_head,
    table_row,
)
from common.cli import path_arg, positive_float, positive_int, run_stoppable
from common.errors import UserError
from data.tokenizer import token_byte_lengths
from model.config import POSITION_KINDS, GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.loading import load_run, validation_tokens
from rundir.record import read_config

CONFIG = ROOT / "configs" / "tiny.yaml"


@dataclass
class Measured:
    name: str
    params: int
    steps: list[int]
    bpb: list[float]
    kv_bytes_per_token: int
    cache_mib_batch16: float
    decode_batch1: float
    decode_batch16: float


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("attention_variants", __doc__)
    p.add_argument("--minutes", type=positive_float, default=None,
                   help=f"training clock per run (train.max_minutes; default: {DEFAULT_MINUTES:g})")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="train every run for this many steps instead of --minutes (train.max_steps, no clock): "
                        "equal work, whatever else the machine runs (default: the clock)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337],
                   help="train.seed of each run of a variant (default: %(default)s)")
    p.add_argument("--latents", type=positive_int, nargs=2, default=[64, 32],
                   help="the two MLA kv_latent_dim sizes (default: %(default)s)")
    p.add_argument("--config", type=path_arg, default=CONFIG,
                   help="the training config every variant starts from (default: %(default)s)")
    p.add_argument("--out", type=path_arg, default=Path("runs/attention_variants"),
                   help="where the runs go (default: %(default)s)")
    p.add_argument("--plot", type=path_arg, default=None, help="PNG to draw (default: <out>/attention_variants.png)")
    p.add_argument("--decode-steps", type=positive_int, default=16,
                   help="decode steps timed at the end of the window (default: %(default)s)")
    add_set_flag(p)
    p.add_argument("--forms", action="store_true", help="only time MLA's expanded vs absorbed forms")
    p.add_argument("--repeats", type=positive_int, default=9,
                   help="with --forms: timed repeats of each step (default: %(default)s)")
    p.add_argument("--reuse-runs", action="store_true",
                   help="measure the finished runs already in --out (trained by an earlier call with the same "
                        "flags) instead of training them again")
    p.add_argument("--positions", nargs="+", metavar="KIND", default=None,
                   help=f"train the positions axis instead, one run per kind and seed ({', '.join(POSITION_KINDS)}; "
                        "default: the attention variants)")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=None, metavar="MULTIPLE",
                   help=f"with --positions: evaluation lengths in multiples of the trained context, each dividing "
                        f"the largest; 1 is always measured (default {' '.join(map(str, DEFAULT_LENGTHS))}; at most "
                        f"{MAX_LENGTH_MULTIPLE})")
    p.add_argument("--eval-windows", type=positive_int, default=None, metavar="N",
                   help=f"with --positions: windows of the longest length scored at every length "
                        f"(default {DEFAULT_EVAL_WINDOWS}; at most {MAX_EVAL_WINDOWS})")
    p.add_argument("--sink-windows", type=positive_int, default=None, metavar="N",
                   help=f"with --positions: validation windows the first-token score averages over "
                        f"(default {DEFAULT_SINK_WINDOWS}; at most {MAX_EVAL_WINDOWS})")
    return p


DEFAULT_LENGTHS = (1, 2, 4)
DEFAULT_EVAL_WINDOWS = 64
DEFAULT_SINK_WINDOWS = 8
# Bounds that keep one evaluation batch's attention maps, and the validation text it reads, finite.
MAX_LENGTH_MULTIPLE = 16
MAX_EVAL_WINDOWS = 4096


def check_budget(args: argparse.Namespace) -> None:
    if args.steps is not None and args.minutes is not None:
        raise UserError("--minutes and --steps are two budgets for the same runs; give one of them")
    if args.steps is None and args.minutes is None:
        args.minutes = DEFAULT_MINUTES


def check_positions_args(args: argparse.Namespace) -> None:
    axis_only = [flag for flag, value in (("--lengths", args.lengths), ("--eval-windows", args.eval_windows),
                                          ("--sink-windows", args.sink_windows)) if value is not None]
    if args.positions is None:
        if axis_only:
            raise UserError(f"{', '.join(axis_only)} go with --positions; add --positions {' '.join(POSITION_KINDS)}")
        return
    if args.forms:
        raise UserError("--forms and --positions are separate benchmarks; give one of them")
    unknown = [kind for kind in args.positions if kind not in POSITION_KINDS]
    if unknown:
        raise UserError(f"--positions: unknown kind {unknown[0]!r}; choose from {', '.join(POSITION_KINDS)}")
    for flag, values in (("--positions", args.positions), ("--seeds", args.seeds), ("--lengths", args.lengths or [])):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise UserError(f"{flag} names {repeated[0]} twice; give each once")
    if args.lengths is not None and max(args.lengths) > MAX_LENGTH_MULTIPLE:
        raise UserError(f"--lengths: {max(args.lengths)} times the context is past the limit of "
                        f"{MAX_LENGTH_MULTIPLE}; give smaller multiples")
    if args.lengths is not None:
        odd = [m for m in args.lengths if max(args.lengths) % m]
        if odd:  # every length cuts the same text into whole windows
            raise UserError(f"--lengths: {odd[0]} does not divide {max(args.lengths)}; give multiples that each "
                            f"divide the largest, e.g. 1 2 4")
    for flag, value in (("--eval-windows", args.eval_windows), ("--sink-windows", args.sink_windows)):
        if value is not None and value > MAX_EVAL_WINDOWS:
            raise UserError(f"{flag} {value} is past the limit of {MAX_EVAL_WINDOWS}; give fewer windows")


DEFAULT_MINUTES = 10.0

# Value embeddings are off in every variant: MLA cannot carry them, and the variants must differ in
# attention alone.
EVERY_VARIANT = {"value_embeddings": False}


def mla_overrides(model: dict) -> dict:
    """The model-section overrides that make the config's model MLA, apart from the latent's width."""
    return {**EVERY_VARIANT, "attention": "mla", "n_kv_head": model["n_head"]}


def variants(model: dict, latents: list[int]) -> dict[str, dict]:
    """The model-section overrides of each variant, on top of the config's model section."""
    mla = mla_overrides(model)
    return {
        "MHA": {**EVERY_VARIANT, "n_kv_head": model["n_head"]},
        f"GQA (n_kv_head {model['n_kv_head']})": EVERY_VARIANT,
        "MQA": {**EVERY_VARIANT, "n_kv_head": 1},
        **{f"MLA (latent {r})": {**mla, "kv_latent_dim": r} for r in latents},
    }


def budget_words(args: argparse.Namespace) -> str:
    return f"{args.minutes:g} training minutes" if args.steps is None else f"{args.steps} training steps"


def slug_of(name: str) -> str:
    """A variant's run folder prefix: its first word and its numbers (``GQA (n_kv_head 2)``: gqa2)."""
    return name.split(" ")[0].lower() + "".join(c for c in name if c.isdigit())


def train(name: str, overrides: dict, seed: int, args: argparse.Namespace, slug: str | None = None) -> Path:
    run_dir = args.out / f"{slug or slug_of(name)}-s{seed}"
    budget = {"train.max_minutes": args.minutes} if args.steps is None else {"train.max_minutes": "null",
                                                                            "train.max_steps": args.steps}
    sets = {**{f"model.{k}": v for k, v in overrides.items()}, **budget,
            "train.seed": seed, "run.out_dir": run_dir, "run.overwrite": True, "logging.wandb.mode": "disabled"}
    if args.reuse_runs:
        check_reusable(run_dir, args)
        print(f"reusing {name}, seed {seed}: {run_dir}", flush=True)
        return run_dir
    print(f"training {name}, seed {seed} -> {run_dir}", flush=True)
    run_train_py(args.config, [f"{key}={value}" for key, value in sets.items()] + args.set)
    return run_dir


def check_reusable(run_dir: Path, args: argparse.Namespace) -> None:
    """A run that --reuse-runs may measure again: finished, and trained with this call's budget."""
    if final_eval(run_dir) is None:
        raise UserError(f"{run_dir} holds no finished run; train it first (leave out --reuse-runs)")
    train = read_config(run_dir).get("train") or {}
    budget = (train.get("max_minutes"), train.get("max_steps") if args.steps is not None else None)
    if budget != (args.minutes, args.steps):
        raise UserError(f"{run_dir} was trained for {budget_of(train)}, not {budget_words(args)}; "
                        "give the budget it was trained with, or leave out --reuse-runs to train again")


def budget_of(train: dict) -> str:
    if train.get("max_minutes") is None:
        return f"{train.get('max_steps')} training steps"
    return f"{train['max_minutes']:g} training minutes"


@torch.inference_mode()
def decode_tokens_per_s(model: GPT, batch: int, steps: int, repeats: int = 3) -> float:
    """Greedy one-token steps over the last ``steps`` positions of a full window (best of ``repeats``)."""
    block = model.config.block_size
    prompt = torch.randint(0, model.config.vocab_size, (batch, block - steps), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(repeats):
        cache = model.init_cache(batch)
        token = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(steps):
            token = model.next_token_logits(token, cache).argmax(-1, keepdim=True)
        best = min(best, time.perf_counter() - start)
    return batch * steps / best


def measure(name: str, run_dirs: list[Path], decode_steps: int) -> Measured:
    model = load_pretrained(run_dirs[0]).eval()
    finals = [final_eval(d) for d in run_dirs]
    return Measured(
        name, model.num_params(), [s for s, _ in finals], [b for _, b in finals],
        model.init_cache(1, max_len=1).nbytes(), model.init_cache(16).nbytes() / 2**20,
        decode_tokens_per_s(model, 1, decode_steps), decode_tokens_per_s(model, 16, decode_steps),
    )


def variants_table(rows: list[Measured]) -> str:
    return table(("variant", "params", "steps", "val bits/byte (per seed)", "KV bytes/token", "cache MiB (B=16, full ctx)",
                  "decode tok/s B=1", "decode tok/s B=16"),
                 ((m.name, f"{m.params:,}", " / ".join(map(str, m.steps)), " / ".join(f"{b:.4f}" for b in m.bpb),
                   f"{m.kv_bytes_per_token:,}", f"{m.cache_mib_batch16:.2f}", f"{m.decode_batch1:,.0f}",
                   f"{m.decode_batch16:,.0f}") for m in rows))


def plot(rows: list[Measured], path: Path, budget: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, m in enumerate(rows):
        mean = statistics.fmean(m.bpb)
        ax.errorbar(m.kv_bytes_per_token, mean, yerr=[[mean - min(m.bpb)], [max(m.bpb) - mean]], fmt="o", capsize=3)
        # Alternate above and below: two variants can share a cache size (MQA and a latent of 2 x head_dim).
        ax.annotate(m.name, (m.kv_bytes_per_token, mean), textcoords="offset points",
                    xytext=(6, 4 if i % 2 == 0 else -12), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache bytes per token (all layers, fp32)")
    ax.set_ylabel("validation bits/byte (lower is better)")
    ax.set_title(f"Attention kinds at equal training budget ({budget} each)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_forms(config: GPTConfig, batch: int = 16, repeats: int = 9) -> None:
    torch.manual_seed(0)
    attention = GPT(config).blocks[0].attn
    x = torch.randn(batch, config.block_size, config.n_embd, requires_grad=True)
    full = torch.ones(1, config.block_size, dtype=torch.bool)
    latents = torch.randn(batch, 1, config.block_size, config.kv_latent_dim)  # a full cache

    def train_step(form):
        q, c = attention.split_heads(x)
        getattr(attention, f"attend_{form}")(q, c, None).sum().backward()

    def decode_step(form):
        with torch.no_grad():
            q, _ = attention.split_heads(x[:, -1:])
            getattr(attention, f"attend_{form}")(q, latents, full)

    print(f"kv_latent_dim {config.kv_latent_dim}, head_dim {config.head_dim}, n_head {config.n_head}, "
          f"batch {batch}, context {config.block_size}: fastest / median ms of {repeats}, forms interleaved")
    for label, step in (("training step (fwd+bwd)", train_step), ("decode step", decode_step)):
        forms = {form: partial(step, form) for form in ("expanded", "absorbed")}
        for form, spent in in_turns(forms, repeats, warmup=1).items():
            print(f"  {label:24} {form:9} {1e3 * min(spent):8.2f} / {1e3 * statistics.median(spent):8.2f}")


@dataclass
class PositionsMeasured:
    kind: str
    attention: str  # the attention kind in words, positions left out (``describe_attention``)
    params: int
    steps: list[int]
    bpb: list[float]
    lengths: list[list[LengthScore]]  # per seed, one score per evaluation length
    first_token: torch.Tensor  # (n_layer, n_head): each head's sink score, the seeds' mean
    block_size: int


def positions_axis(args: argparse.Namespace, model: dict) -> int:
    runs: dict[str, list[Path]] = {kind: [] for kind in args.positions}
    for seed in args.seeds:  # seed-major: a burst of load from other processes hits every kind alike
        for kind in args.positions:
            slug = f"{slug_of(variant_name(model))}-{kind}"
            runs[kind].append(train(f"positions {kind}", {**EVERY_VARIANT, "positions": kind}, seed, args, slug))
    multiples = sorted({1, *(args.lengths or DEFAULT_LENGTHS)})  # the trained context is the reference
    rows = [measure_positions(kind, run_dirs, multiples, args) for kind, run_dirs in runs.items()]
    print(f"\n{args.config.name}, {budget_words(args)} per run, seeds {args.seeds} (trained seed by "
          f"seed), torch threads {torch.get_num_threads()}\n")
    print(positions_table(rows))
    print()
    print(extrapolation_table(rows))
    print()
    print(first_token_table(rows))
    path = args.plot or args.out / "positions_extrapolation.png"
    plot_extrapolation(rows, path, budget_words(args))
    print(f"\nfigure: {path}")
    return 0


def variant_name(model: dict) -> str:
    """The name of the config's own variant, as ``variants`` calls it."""
    if model.get("attention", "gqa") == "mla":
        return f"MLA (latent {model.get('kv_latent_dim')})"
    return f"GQA (n_kv_head {model['n_kv_head']})"


def measure_positions(kind: str, run_dirs: list[Path], multiples: list[int], args: argparse.Namespace) -> PositionsMeasured:
    finals = [final_eval(d) for d in run_dirs]
    lengths, sinks = [], []
    for run_dir in run_dirs:
        run = load_run(run_dir, torch.device("cpu"))
        T = run.block_size
        tokens = validation_tokens(run, "train it with a plain-text config")
        token_bytes = torch.from_numpy(token_byte_lengths(run.tokenizer))
        windows = args.eval_windows or DEFAULT_EVAL_WINDOWS
        span = scored_span(len(tokens), [m * T for m in multiples], windows)
        if span == 0:
            raise UserError(f"the validation split of {run_dir} ({len(tokens)} tokens) holds no window of "
                            f"{max(multiples) * T} tokens; give smaller --lengths")
        lengths.append(bits_per_byte_at_lengths(run.model, tokens, token_bytes, [m * T for m in multiples],
                                                span=span, batch_size=8))
        count = min(args.sink_windows or DEFAULT_SINK_WINDOWS, len(tokens) // T)
        held_out = torch.from_numpy(np.asarray(tokens[:count * T], dtype=np.int64).reshape(count, T))
        sinks.append(first_token_attention(run.model, held_out))
    model = run.model
    heads = describe_attention(model.config.model_copy(update={"positions": "learned"}))
    return PositionsMeasured(kind, heads, model.num_params(), [s for s, _ in finals],
                             [b for _, b in finals], lengths, torch.stack(sinks).mean(0), model.config.block_size)


def positions_table(rows: list[PositionsMeasured]) -> str:
    """Quality at equal time. The last column is each kind's mean minus the first kind's, over the
    standard error of that difference (Welch's t): with three seeds each, beyond about ±2.8 the
    difference is larger than seed-to-seed noise explains (two-sided, 5%)."""
    base = rows[0]
    lines = [table_head(f"positions ({base.attention})", "params", "steps (per seed)", "val bits/byte (per seed)",
                        "mean ± std", f"vs {base.kind}: Δ (Δ/SE)")]
    for m in rows:
        mean, std = mean_std(m.bpb)
        delta = "-"
        if m is not base:
            d = mean - statistics.fmean(base.bpb)
            se = math.sqrt(mean_std(m.bpb)[1] ** 2 / len(m.bpb) + mean_std(base.bpb)[1] ** 2 / len(base.bpb))
            delta = f"{d:+.4f} ({d / se:+.1f})" if se > 0 else f"{d:+.4f} (n/a: one seed)"
        lines.append(table_row(m.kind, f"{m.params:,}", " / ".join(map(str, m.steps)),
                               " / ".join(f"{b:.4f}" for b in m.bpb), f"{mean:.4f} ± {std:.4f}", delta))
    return "\n".join(lines)


def extrapolation_table(rows: list[PositionsMeasured]) -> str:
    """Bits/byte at each evaluation length: the seeds' mean ± standard deviation, or why not possible."""
    lengths = [score.length for score in rows[0].lengths[0]]
    T = rows[0].block_size
    lines = [table_head("positions", *(f"{n} tokens ({n / T:g}×)" for n in lengths))]
    for m in rows:
        cells = []
        for i in range(len(lengths)):
            scores = [seed[i] for seed in m.lengths]
            if scores[0].bpb is None:
                cells.append(f"not possible ({scores[0].not_possible})")
            else:
                mean, std = mean_std([s.bpb for s in scores])
                change, change_std = mean_std([s.bpb - seed[0].bpb for s, seed in zip(scores, m.lengths)])
                cells.append(f"{mean:.4f} ± {std:.4f}" + (f" ({change:+.4f} ± {change_std:.4f})" if i else ""))
        lines.append(table_row(m.kind, *cells))
    scored = rows[0].lengths[0][0].bytes
    lines.append(f"\nThe seeds' mean ± standard deviation, and in brackets the change from each run's own score at "
                 f"{lengths[0]} tokens; the same {scored:,} bytes of validation text at every length (back-to-back "
                 f"windows).")
    return "\n".join(lines)


def first_token_table(rows: list[PositionsMeasured]) -> str:
    """Each head's first-token (sink) score, the seeds' mean, one column per kind."""
    n_layer, n_head = rows[0].first_token.shape
    lines = [table(("layer.head", *(m.kind for m in rows)),
                   [*((f"{layer}.{head}", *(f"{float(m.first_token[layer, head]):.3f}" for m in rows))
                      for layer in range(n_layer) for head in range(n_head)),
                    ("mean of heads", *(f"{float(m.first_token.mean()):.3f}" for m in rows)),
                    ("heads above 0.5", *(str(int((m.first_token > 0.5).sum())) for m in rows))])]
    even = even_spread_first_token(rows[0].block_size)
    lines.append(f"\nA head that spreads every query evenly scores {even:.3f} at {rows[0].block_size} tokens.")
    return "\n".join(lines)


def plot_extrapolation(rows: list[PositionsMeasured], path: Path, budget: str) -> None:
    """Left: bits/byte against the evaluation window, one line per kind (the seeds' mean, a bar
    spanning them). Right: the same less each run's own score at the trained context, so that what
    differs between seeds (their training) falls out and only the change with length is left."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    T = rows[0].block_size
    every_length = [score.length for score in rows[0].lengths[0]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in rows:
        columns = [i for i, score in enumerate(m.lengths[0]) if score.bpb is not None]
        lengths = [m.lengths[0][i].length for i in columns]
        missing = [score for score in m.lengths[0] if score.bpb is None]
        label = m.kind + (f" (not possible past {T} tokens)" if missing else "")
        for ax, less_own in ((left, False), (right, True)):
            values = [[seed[i].bpb - (seed[0].bpb if less_own else 0.0) for seed in m.lengths] for i in columns]
            means = [statistics.fmean(v) for v in values]
            spread = [[mu - min(v) for mu, v in zip(means, values)], [max(v) - mu for mu, v in zip(means, values)]]
            ax.errorbar(lengths, means, yerr=spread, marker="o", capsize=3, label=label)
    for ax in (left, right):
        ax.axvline(T, color="grey", linestyle="--", linewidth=1)
        ax.annotate("trained context", (T, 1), xycoords=("data", "axes fraction"), xytext=(4, -12),
                    textcoords="offset points", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks(every_length, [str(n) for n in every_length])
        ax.set_xlabel("evaluation window (tokens)")
        ax.grid(alpha=0.3)
    left.set_ylabel("validation bits/byte (lower is better)")
    right.set_ylabel(f"bits/byte less the run's own at {T} tokens")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.92))  # the right panel's corner is empty
    fig.suptitle(f"Positions past the trained context ({budget} each; seeds' mean, bars span the seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, compare)


def compare(args: argparse.Namespace) -> int:
    from common.config import read_yaml_file

    check_budget(args)
    check_positions_args(args)
    doc = read_yaml_file(args.config)
    model = doc["model"]
    if args.positions is not None:
        return positions_axis(args, model)
    if args.forms:
        shape = {**model, "vocab_size": doc["data"]["vocab_size"], **mla_overrides(model)}
        for r in args.latents:
            compare_forms(GPTConfig.from_dict({**shape, "kv_latent_dim": r}), repeats=args.repeats)
        return 0
    rows = []
    for name, overrides in variants(model, args.latents).items():
        run_dirs = [train(name, overrides, seed, args) for seed in args.seeds]
        rows.append(measure(name, run_dirs, args.decode_steps))
    print(f"\n{args.config.name}, {budget_words(args)} per run, seeds {args.seeds}, "
          f"torch threads {torch.get_num_threads()}\n")
    print(variants_table(rows))
    path = args.plot or args.out / "attention_variants.png"
    plot(rows, path, budget_words(args))
    print(f"\nfigure: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
