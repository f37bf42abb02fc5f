"""Attention kinds side by side: configs/tiny.yaml trained once per variant, at equal wall time, on
the same data and seed, then measured for quality, cache size and decode speed.

    python -m benchmarks.attention_variants --minutes 10 --seeds 1337 1338 --plot docs/attention_variants.png
    python -m benchmarks.attention_variants --minutes 0.1 --set eval.final_max_batches=4   # a quick check
    python -m benchmarks.attention_variants --forms                         # MLA: expanded vs absorbed

Variants: MHA (n_kv_head = n_head), GQA as the config ships it, MQA (n_kv_head = 1), and multi-head
latent attention at two latent sizes (``--latents``). Each one is a real ``train.py`` run (in
``--out``/<variant>-s<seed>) whose training clock is ``--minutes`` (train.max_minutes; the
final validation pass over the whole split comes after it). The markdown table reports, per variant:
parameters, steps reached, final validation bits/byte (each seed), KV cache bytes per token (all
layers, fp32), cache MiB at batch 16 and full context, and decode tokens/s at full context (the last
``--decode-steps`` positions of the window) at batch 1 and 16. The figure plots bits/byte against
KV bytes per token, one labelled point per variant (the seeds' mean, a bar spanning them).

``--forms`` times one latent-attention layer of the tiny shape in both forms (``model.gpt.LatentAttention``):
a training step (forward + backward over a batch of whole windows) and a one-token decode step
at full context. It is how the model's choice of form for each case was made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.cli import ArgumentParser, path_arg, positive_float, positive_int, run_stoppable
from common.errors import UserError
from model import GPT, GPTConfig, load_pretrained

ROOT = Path(__file__).resolve().parents[1]
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
    p = ArgumentParser(prog="python -m benchmarks.attention_variants", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=positive_float, default=10.0, help="training clock per run (train.max_minutes)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337], help="train.seed of each run of a variant")
    p.add_argument("--latents", type=positive_int, nargs=2, default=[64, 32], help="the two MLA kv_latent_dim sizes")
    p.add_argument("--config", type=path_arg, default=CONFIG, help="the training config every variant starts from")
    p.add_argument("--out", type=path_arg, default=Path("runs/attention_variants"), help="where the runs go")
    p.add_argument("--plot", type=path_arg, default=None, help="PNG to draw (default: <out>/attention_variants.png)")
    p.add_argument("--decode-steps", type=positive_int, default=16, help="decode steps timed at the end of the window")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a further train.py override for every run (e.g. eval.final_max_batches=4); repeatable")
    p.add_argument("--forms", action="store_true", help="only time MLA's expanded vs absorbed forms")
    p.add_argument("--repeats", type=positive_int, default=9, help="with --forms: timed repeats of each step")
    return p


# Value embeddings are off in every variant: MLA cannot carry them, and the variants must differ in
# attention alone.
EVERY_VARIANT = {"value_embeddings": False}


def mla_overrides(model: dict) -> dict:
    """The model-section overrides that make the config's model multi-head latent attention, apart
    from the latent's width."""
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


def train(name: str, overrides: dict, seed: int, args: argparse.Namespace) -> Path:
    slug = name.split(" ")[0].lower() + "".join(c for c in name if c.isdigit())
    run_dir = args.out / f"{slug}-s{seed}"
    sets = {**{f"model.{k}": v for k, v in overrides.items()}, "train.max_minutes": args.minutes,
            "train.seed": seed, "run.out_dir": run_dir, "run.overwrite": True, "logging.wandb.mode": "disabled"}
    print(f"training {name}, seed {seed} -> {run_dir}", flush=True)
    run_train_py(args.config, [f"{key}={value}" for key, value in sets.items()] + args.set)
    return run_dir


def run_train_py(config: Path, settings: list[str]) -> None:
    """``train.py --config config --set ...`` for every setting, quietly. A refusal (exit 2: a missing
    config, a bad --set, an out_dir that is not a run) is the user's to fix, so it comes back as
    train.py's own one-line message; any other failure shows train.py's output and raises."""
    command = [sys.executable, str(ROOT / "train.py"), "--config", str(config), "--no-progress"]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode == 2:
        refusal = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        raise UserError(f"train.py refused the run: {(refusal or ['(no message)'])[-1].removeprefix('error: ')}")
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise subprocess.CalledProcessError(done.returncode, command)


def final_eval(run_dir: Path) -> tuple[int, float]:
    """(steps, val bits/byte) from the run's final evaluation record."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = [r for r in records if r.get("kind") == "final_eval"][-1]
    return final["step"], final["val_bpb"]


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


def table(rows: list[Measured]) -> str:
    lines = ["| variant | params | steps | val bits/byte (per seed) | KV bytes/token | cache MiB (B=16, full ctx) "
             "| decode tok/s B=1 | decode tok/s B=16 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in rows:
        bpb = " / ".join(f"{b:.4f}" for b in m.bpb)
        steps = " / ".join(str(s) for s in m.steps)
        lines.append(f"| {m.name} | {m.params:,} | {steps} | {bpb} | {m.kv_bytes_per_token:,} | "
                     f"{m.cache_mib_batch16:.2f} | {m.decode_batch1:,.0f} | {m.decode_batch16:,.0f} |")
    return "\n".join(lines)


def plot(rows: list[Measured], path: Path, minutes: float) -> None:
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
    ax.set_title(f"Attention kinds at equal training time ({minutes:g} min each)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_forms(config: GPTConfig, batch: int = 16, repeats: int = 9) -> None:
    """Time a training step and a decode step of one MLA layer, in each form."""
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
        times: dict[str, list[float]] = {"expanded": [], "absorbed": []}
        for form in times:
            step(form)  # warm up
        for _ in range(repeats):  # alternating, so that load from other processes hits both alike
            for form, spent in times.items():
                start = time.perf_counter()
                step(form)
                spent.append(time.perf_counter() - start)
        for form, spent in times.items():
            print(f"  {label:24} {form:9} {1e3 * min(spent):8.2f} / {1e3 * statistics.median(spent):8.2f}")


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, compare)


def compare(args: argparse.Namespace) -> int:
    from common.config import read_yaml_file

    doc = read_yaml_file(args.config)
    model = doc["model"]
    if args.forms:
        shape = {**model, "vocab_size": doc["data"]["vocab_size"], **mla_overrides(model)}
        for r in args.latents:
            compare_forms(GPTConfig.from_dict({**shape, "kv_latent_dim": r}), repeats=args.repeats)
        return 0
    rows = []
    for name, overrides in variants(model, args.latents).items():
        run_dirs = [train(name, overrides, seed, args) for seed in args.seeds]
        rows.append(measure(name, run_dirs, args.decode_steps))
    print(f"\n{args.config.name}, {args.minutes:g} training minutes per run, seeds {args.seeds}, "
          f"torch threads {torch.get_num_threads()}\n")
    print(table(rows))
    path = args.plot or args.out / "attention_variants.png"
    plot(rows, path, args.minutes)
    print(f"\nfigure: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
