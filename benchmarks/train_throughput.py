"""Training throughput and MFU of a config's model, next to a nanoGPT-style reference model.

    python -m benchmarks.train_throughput --config configs/tiny.yaml --steps 20
    python -m benchmarks.train_throughput --config configs/tiny.yaml --compile both

1. Measures this machine's matmul peak itself: large square matmuls, best of several (fp32 on
   the CPU, bf16 on CUDA; the dtype the trainer computes in).
2. Runs ``--steps`` full optimizer steps (forward, backward, clipping, and the config's optimizer:
   the trainer's own functions) of the config's model on random tokens, after ``--warmup``
   untimed steps. ``--set train.optimizer=adamw`` shows what Muon's extra matmuls cost.
3. Does the same for a nanoGPT-style model of the same width, depth, context and vocabulary,
   written here as a comparison point, with the same optimizer. It is nanoGPT's GPT as its
   train.py trains it (``bias = False``): LayerNorm without bias, multi-head attention with a
   fused qkv projection, exact-erf GELU MLP 4x (``nn.GELU()``), no biases in any Linear, tied
   embeddings. (On a CPU both choices make it faster than a GPT-2 block with biases and the tanh
   GELU, so it is the harder comparison.)

FLOPs per token are counted the same way for both (``flops_per_token`` below, the convention
``model.GPT.flops_per_token`` uses: 6 per matmul weight plus the full attention matrix), so the
MFU column compares how well each model turns its arithmetic into throughput. The optimizer's
own arithmetic (Muon's Newton-Schulz iterations) is not model FLOPs, so it lowers MFU.

Timings only; nothing here is a test. ``measure_run`` is the per-run measurement, kept apart so
that a multi-process launcher can call it per rank.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.cli import ArgumentParser, positive_int, run_command
from common.device import select_device
from training import TrainConfig, autocast, configure_backends, format_flops, resolve_precision, synchronize


# ---------------------------------------------------------------------------------------------
# The reference: nanoGPT's block with its train.py defaults (no biases, exact GELU)


class RefAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = RefAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd, bias=False)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.out = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.n_layer, self.n_head, self.n_embd, self.block_size = n_layer, n_head, n_embd, block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(RefBlock(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def flops_per_token(model: nn.Module, n_layer: int, n_embd: int, seq_len: int) -> int:
    """Training FLOPs per token: 6 per weight used in a matmul (forward 2, backward 4), plus the
    attention scores and weighted sum over the full seq_len x seq_len matrix."""
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * matmul_params + 6 * 2 * n_layer * n_embd * seq_len


# ---------------------------------------------------------------------------------------------
# Measurements


def measure_peak(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """Best FLOP/s of large square matmuls on ``device`` (what the hardware can do here)."""
    sizes = (1024, 2048) if device.type == "cpu" else (4096, 8192)
    best = 0.0
    for size in sizes:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        torch.matmul(a, b)
        synchronize(device)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            synchronize(device)
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


class TrainStepRunner:
    """One model with its optimizer and a few random batches, ready to take timed steps.

    A step is what the trainer does per optimizer step (its own functions): forward and backward
    through ``accumulate_gradients``, gradient clipping, the optimizer ``train`` configures.
    """

    def __init__(
        self,
        name: str,
        model: nn.Module,
        *,
        flops: int,
        batch_size: int,
        block_size: int,
        vocab_size: int,
        device: torch.device,
        amp_dtype: torch.dtype,
        compile_model: bool,
        train: TrainConfig,
    ) -> None:
        from training import build_optimizer, plan_param_groups

        self.name, self.flops, self.compiled = name, flops, compile_model
        self.device, self.amp_dtype, self.grad_clip = device, amp_dtype, train.grad_clip
        self.tokens_per_step = batch_size * block_size
        self.model = model.to(device).train()
        self.params = sum(p.numel() for p in model.parameters())
        self.optimizer = build_optimizer(plan_param_groups(self.model, train), train, device)
        self.run_model = torch.compile(self.model) if compile_model else self.model
        gen = torch.Generator().manual_seed(0)
        windows = torch.randint(0, vocab_size, (4, batch_size, block_size + 1), generator=gen).to(device)
        self.batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]
        self.count = 0

    def step(self) -> float:
        """One optimizer step; returns its wall-clock seconds (device work included)."""
        from training import accumulate_gradients, clip_gradients

        batch = self.batches[self.count % len(self.batches)]
        self.count += 1
        synchronize(self.device)
        t0 = time.perf_counter()
        accumulate_gradients(self.run_model, lambda: batch, 1, amp=lambda: autocast(self.device, self.amp_dtype))
        clip_gradients(self.model, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        return time.perf_counter() - t0


@dataclass
class RunMeasurement:
    name: str
    compiled: bool
    params: int
    flops_per_token: int
    tokens_per_s: float  # from the median step time
    step_s: float  # median
    first_step_s: float  # includes compilation when compiled

    def mfu(self, peak: float) -> float:
        return self.flops_per_token * self.tokens_per_s / peak


def measure_run(runner: TrainStepRunner, *, steps: int, warmup: int = 2) -> RunMeasurement:
    """Warm up (the first step pays for compilation), then time ``steps`` steps."""
    first = runner.step()
    for _ in range(warmup - 1):
        runner.step()
    times = [runner.step() for _ in range(steps)]
    return summarize(runner, times or [first], first)


def summarize(runner: TrainStepRunner, step_times: list[float], first_step_s: float) -> RunMeasurement:
    # The median, because other processes on a shared machine make single steps slow at random.
    step_s = median(step_times)
    return RunMeasurement(
        name=runner.name,
        compiled=runner.compiled,
        params=runner.params,
        flops_per_token=runner.flops,
        tokens_per_s=runner.tokens_per_step / step_s,
        step_s=step_s,
        first_step_s=first_step_s,
    )


def paired_ratio_quartiles(
    ours: list[list[float]], ref: list[list[float]], flops_ratio: float
) -> tuple[float, float, float]:
    """Quartiles of the MFU ratio ours/reference taken round by round.

    Both models ran in the same round within a second or so of each other, so each round's ratio
    of their median step times is free of the slow drift of the host's speed; the spread of these
    ratios shows how far one run's overall ratio can be trusted.
    """
    ratios = sorted(
        flops_ratio * median(r) / median(o) for o, r in zip(ours, ref, strict=True)
    )
    n = len(ratios)
    return ratios[n // 4], ratios[n // 2], ratios[(3 * n) // 4]


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


# ---------------------------------------------------------------------------------------------
# Command line


def throughput_parser(module: str, description: str, steps_help: str) -> argparse.ArgumentParser:
    """The flags both throughput benchmarks (``benchmarks.<module>``) take: the config, its overrides
    and the step counts."""
    parser = ArgumentParser(prog=f"python -m benchmarks.{module}", description=description)
    parser.add_argument("--config", default="configs/tiny.yaml",
                        help="the training config timed (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override; repeatable (default: none)")
    parser.add_argument("--steps", type=positive_int, default=10, help=f"{steps_help} (default: %(default)s)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps first (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = throughput_parser("train_throughput", __doc__.split("\n\n")[0], "timed steps per model")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help="interleaved timing rounds, the steps split over them (default: one step per round)")
    parser.add_argument("--compile", choices=("auto", "true", "false", "both"), default="auto",
                        help="compile the models; auto: on CUDA only (default: %(default)s)")
    parser.add_argument("--no-reference", action="store_true", help="measure only the config's model")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:

    from common.errors import UserError
    from model import GPT
    from training import install_cpu_backward, load_run_config

    try:
        cfg = load_run_config(args.config, args.overrides)
        device = select_device(cfg.train.device)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_backends(device)
    amp_dtype = resolve_precision(cfg.train.precision, device)
    if args.compile == "both":
        compile_modes = [False, True]
    elif args.compile == "auto":
        compile_modes = [device.type == "cuda"]
    else:
        compile_modes = [args.compile == "true"]

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    dtype_name = "bf16" if amp_dtype == torch.bfloat16 else "fp32"
    peak = measure_peak(device, amp_dtype)
    m, tc = cfg.model, cfg.train
    print(f"device: {name}; measured {dtype_name} matmul peak {format_flops(peak)}FLOP/s")
    print(f"config: {args.config}: {m.n_layer} layers, {m.n_embd} wide, {m.n_head}/{m.n_kv_head} heads, "
          f"block {m.block_size}, vocab {m.vocab_size}, batch {tc.batch_size}, {tc.optimizer}; "
          f"{args.steps} timed steps\n")

    common = dict(batch_size=tc.batch_size, block_size=m.block_size, vocab_size=m.vocab_size,
                  device=device, amp_dtype=amp_dtype, train=tc)
    runners: list[TrainStepRunner] = []
    for compiled in compile_modes:
        torch.manual_seed(0)
        ours = GPT(m)
        install_cpu_backward(ours)  # as the trainer does
        assert flops_per_token(ours, m.n_layer, m.n_embd, m.block_size) == ours.flops_per_token()
        runners.append(TrainStepRunner("ours (GQA, SwiGLU, RMSNorm)", ours, flops=ours.flops_per_token(),
                                       compile_model=compiled, **common))
        if not args.no_reference:
            torch.manual_seed(0)
            ref = RefGPT(m.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd)
            runners.append(TrainStepRunner("nanoGPT-style reference", ref,
                                           flops=flops_per_token(ref, m.n_layer, m.n_embd, m.block_size),
                                           compile_model=compiled, **common))
    # Warm every model up, then time them in interleaved rounds (by default one step each in
    # turn) so that the host's speed, which drifts with other processes' load, hits all alike.
    first = {id(r): measure_run(r, steps=0, warmup=max(1, args.warmup)).first_step_s for r in runners}
    rounds = max(1, min(args.steps, args.rounds or args.steps))
    per_round = max(1, args.steps // rounds)
    by_round: dict[int, list[list[float]]] = {id(r): [] for r in runners}
    for _ in range(rounds):
        for r in runners:
            by_round[id(r)].append([r.step() for _ in range(per_round)])
    results = [summarize(r, [t for rnd in by_round[id(r)] for t in rnd], first[id(r)]) for r in runners]
    # Measured again after the runs: the better of the two is the less disturbed one.
    peak = max(peak, measure_peak(device, amp_dtype))
    print(f"peak used for MFU (best of before/after): {format_flops(peak)}FLOP/s\n")

    header = f"{'model':30} {'compile':>7} {'params':>8} {'FLOPs/tok':>9} {'tok/s':>10} {'ms/step':>9} {'1st step s':>10} {'MFU':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.name:30} {str(r.compiled).lower():>7} {r.params / 1e6:7.2f}M {format_flops(r.flops_per_token):>9} "
              f"{r.tokens_per_s:10.0f} {1e3 * r.step_s:9.1f} {r.first_step_s:10.2f} "
              f"{100 * r.mfu(peak):6.1f}%")
    print()
    for compiled in compile_modes:
        # results[i] measured runners[i]; in each compile mode ours comes first, then the reference.
        pair = [i for i, r in enumerate(runners) if r.compiled == compiled]
        if len(pair) == 2:
            ours, ref = (runners[i] for i in pair)
            ours_mfu, ref_mfu = (results[i].mfu(peak) for i in pair)
            low, mid, high = paired_ratio_quartiles(by_round[id(ours)], by_round[id(ref)], ours.flops / ref.flops)
            print(f"compile={str(compiled).lower()}: MFU ratio ours/reference = {ours_mfu / ref_mfu:.3f} "
                  f"(tokens/s ratio {results[pair[0]].tokens_per_s / results[pair[1]].tokens_per_s:.3f}); "
                  f"round by round: median {mid:.3f}, middle half {low:.3f}-{high:.3f} over {rounds} rounds")
    if len(compile_modes) == 2:
        for label in {r.name for r in results}:
            eager, comp = (next(r for r in results if r.name == label and r.compiled == c) for c in (False, True))
            print(f"{label}: compiled/eager tokens/s = {comp.tokens_per_s / eager.tokens_per_s:.2f}, "
                  f"compile cost {comp.first_step_s - eager.first_step_s:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
