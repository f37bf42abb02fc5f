"""Training throughput and MFU of a config's model in bf16 and fp32, next to a nanoGPT-style reference.

    python -m benchmarks.train_throughput --config configs/tiny.yaml --steps 20
    python -m benchmarks.train_throughput --config configs/tiny.yaml --no-reference --steps 60
    python -m benchmarks.train_throughput --config configs/tiny.yaml --compile both --precision fp32
    torchrun --standalone --nproc_per_node=2 -m benchmarks.train_throughput --ddp --config configs/small.yaml

1. Measures this machine's matmul peak itself in each precision timed: large square matmuls, best
   of several.
2. Runs ``--steps`` full optimizer steps (forward, backward, clipping, and the config's optimizer:
   the trainer's own functions) of the config's model on random tokens, after ``--warmup``
   untimed steps, under bf16 autocast and in fp32 (``--precision both``, the default; or one of
   them), whatever the config's ``train.precision`` says. ``--set train.optimizer=adamw`` shows what
   Muon's extra matmuls cost.
3. Does the same, with the same optimizer, for ``RefGPT``: nanoGPT's GPT as its train.py trains it
   (``bias = False``), at the same width, depth, context and vocabulary. On a CPU its choices (no
   biases, exact-erf GELU) make it faster than a GPT-2 block with biases and the tanh GELU, so it is
   the harder comparison.

FLOPs per token are counted the same way for both (``flops_per_token`` below, the convention
``model.gpt.GPT.flops_per_token`` uses: 6 per matmul weight plus the full attention matrix), so the
MFU column compares how well each model turns its arithmetic into throughput, each row against
the peak of its own precision. The optimizer's own arithmetic (Muon's Newton-Schulz iterations,
fp32 on the CPU at either precision) is not model FLOPs, so it lowers MFU.

``--ddp``, under torchrun, measures data-parallel scaling instead: every rank runs ``--steps`` steps
of the config's model wrapped by ``training.wrap_model`` (DDP, NCCL between GPUs, gloo on CPU), each on
its own micro-batch, so the all-reduce of every step is in the timing; then rank 0 alone runs the same
steps without DDP, the baseline. The scaling efficiency is global tokens/s over N x the baseline's
(with gradient accumulation the trainer all-reduces less often, so it does at least as well)."""

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.shared import benchmark_parser, best_seconds, quartiles, table
from common.cli import positive_int, run_command
from common.device import select_device
from common.errors import UserError
from training.config import TrainConfig
from training.device import autocast, configure_backends, precision_name, resolve_precision, synchronize
from training.distributed import init_distributed, shutdown, wrap_model
from training.metrics import format_flops

OURS, REFERENCE = "ours (GQA, SwiGLU, RMSNorm)", "nanoGPT-style reference"


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


def measure_peak(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """Best FLOP/s of large square matmuls on ``device`` (what the hardware can do here)."""
    sizes = (1024, 2048) if device.type == "cpu" else (4096, 8192)
    best = 0.0
    for size in sizes:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        torch.matmul(a, b)
        best = max(best, 2 * size**3 / best_seconds(lambda: torch.matmul(a, b), repeats, lambda: synchronize(device)))
    return best


class TrainStepRunner:
    """One model with its optimizer and a few random batches, ready to take timed steps (a step as above)."""

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
        from training.optim import build_optimizer, plan_param_groups

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
        from training.tasks.task import accumulate_gradients
        from training.trainer import clip_gradients

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
    step_s = statistics.median(step_times)
    return RunMeasurement(
        name=runner.name,
        compiled=runner.compiled,
        params=runner.params,
        flops_per_token=runner.flops,
        tokens_per_s=runner.tokens_per_step / step_s,
        step_s=step_s,
        first_step_s=first_step_s,
    )


def paired_ratio_quartiles(ours: list[list[float]], ref: list[list[float]], flops_ratio: float,
                           ) -> tuple[float, float, float]:
    """Quartiles, over the rounds, of ``flops_ratio`` x (ref's median step time / ours'): the MFU
    ratio ours/reference for two models, the speed-up for one model at two precisions (ratio 1)."""
    return quartiles([flops_ratio * statistics.median(r) / statistics.median(o) for o, r in zip(ours, ref, strict=True)])


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("train_throughput", __doc__)
    parser.add_argument("--config", default="configs/tiny.yaml", help="the training config timed (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override; repeatable (default: none)")
    parser.add_argument("--steps", type=positive_int, default=10,
                        help="timed steps per model and precision (default: %(default)s)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps first (default: %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help="interleaved timing rounds, the steps split over them (default: one step per round)")
    parser.add_argument("--compile", choices=("auto", "true", "false", "both"), default="auto",
                        help="compile the models; auto: on CUDA only (default: %(default)s)")
    parser.add_argument("--precision", choices=("both", "bf16", "fp32"), default="both",
                        help="the autocast precision of the step: both times bf16 and fp32 side by side; the "
                             "config's train.precision is not used, but under --ddp both means it (default: %(default)s)")
    parser.add_argument("--no-reference", action="store_true", help="measure only the config's model")
    parser.add_argument("--ddp", action="store_true", help="measure data-parallel scaling, under torchrun")
    return run_command(parser, argv, lambda args: measure_ddp(args) if args.ddp else measure(args))


def measured_precisions(choice: str, device: torch.device) -> list[torch.dtype]:
    """The autocast dtypes ``--precision`` asks for, bf16 first; refused where the device has no bf16."""
    names = ("bf16", "fp32") if choice == "both" else (choice,)
    try:
        return [resolve_precision(name, device) for name in names]
    except UserError:
        raise UserError(f"--precision {choice} times bf16, which this GPU does not support; use --precision fp32") from None


def measure(args: argparse.Namespace) -> int:
    from model.gpt import GPT
    from training.config import load_run_config
    from training.rms_norm_cpu import install_cpu_backward

    cfg = load_run_config(args.config, args.overrides)
    device = select_device(cfg.train.device)
    configure_backends(device)
    dtypes = measured_precisions(args.precision, device)
    if args.compile == "both":
        compile_modes = [False, True]
    elif args.compile == "auto":
        compile_modes = [device.type == "cuda"]
    else:
        compile_modes = [args.compile == "true"]

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peaks = {dtype: measure_peak(device, dtype) for dtype in dtypes}
    m, tc = cfg.model, cfg.train
    print(f"device: {name}; measured matmul peak " + ", ".join(
        f"{format_flops(peak)}FLOP/s in {precision_name(dtype)}" for dtype, peak in peaks.items()))
    print(f"config: {args.config}: {m.n_layer} layers, {m.n_embd} wide, {m.n_head}/{m.n_kv_head} heads, "
          f"block {m.block_size}, vocab {m.vocab_size}, batch {tc.batch_size}, {tc.optimizer}; "
          f"{args.steps} timed steps\n")

    common = dict(batch_size=tc.batch_size, block_size=m.block_size, vocab_size=m.vocab_size, device=device, train=tc)
    runners: list[TrainStepRunner] = []
    for compiled in compile_modes:
        for dtype in dtypes:
            torch.manual_seed(0)
            ours = GPT(m)
            install_cpu_backward(ours)  # as the trainer does
            assert flops_per_token(ours, m.n_layer, m.n_embd, m.block_size) == ours.flops_per_token()
            runners.append(TrainStepRunner(OURS, ours, flops=ours.flops_per_token(), compile_model=compiled,
                                           amp_dtype=dtype, **common))
            if not args.no_reference:
                torch.manual_seed(0)
                ref = RefGPT(m.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd)
                runners.append(TrainStepRunner(REFERENCE, ref, flops=flops_per_token(ref, m.n_layer, m.n_embd, m.block_size),
                                               compile_model=compiled, amp_dtype=dtype, **common))
    # Warm every model up, then time them in interleaved rounds (by default one step each in
    # turn, every other round in reverse order) so that the host's speed, which drifts with other
    # processes' load, hits all alike: the bf16 and fp32 steps of one round are seconds apart.
    first = {id(r): measure_run(r, steps=0, warmup=max(1, args.warmup)).first_step_s for r in runners}
    rounds = max(1, min(args.steps, args.rounds or args.steps))
    per_round = max(1, args.steps // rounds)
    by_round: dict[int, list[list[float]]] = {id(r): [] for r in runners}
    for i in range(rounds):
        for r in runners if i % 2 == 0 else runners[::-1]:
            by_round[id(r)].append([r.step() for _ in range(per_round)])
    results = {id(r): summarize(r, [t for rnd in by_round[id(r)] for t in rnd], first[id(r)]) for r in runners}
    # Measured again after the runs: the better of the two is the less disturbed one.
    peaks = {dtype: max(peak, measure_peak(device, dtype)) for dtype, peak in peaks.items()}
    print("peak used for MFU (best of before/after): " + ", ".join(
        f"{format_flops(peak)}FLOP/s in {precision_name(dtype)}" for dtype, peak in peaks.items()) + "\n")

    print(table(("model", "precision", "compile", "params", "FLOPs/tok", "tok/s", "ms/step", "1st step s", "MFU"),
                ((r.name, precision_name(runner.amp_dtype), str(r.compiled).lower(), f"{r.params / 1e6:.2f}M",
                  format_flops(r.flops_per_token), f"{r.tokens_per_s:.0f}", f"{1e3 * r.step_s:.1f}",
                  f"{r.first_step_s:.2f}", f"{100 * r.mfu(peaks[runner.amp_dtype]):.1f}%")
                 for runner in runners for r in [results[id(runner)]]), left=3))
    print()

    def runner_for(label: str, compiled: bool, dtype: torch.dtype) -> TrainStepRunner | None:
        return next((r for r in runners if (r.name, r.compiled, r.amp_dtype) == (label, compiled, dtype)), None)

    for compiled in compile_modes:
        for dtype in dtypes:
            ours, ref = runner_for(OURS, compiled, dtype), runner_for(REFERENCE, compiled, dtype)
            if ref is None:
                continue
            peak = peaks[dtype]
            low, mid, high = paired_ratio_quartiles(by_round[id(ours)], by_round[id(ref)], ours.flops / ref.flops)
            print(f"compile={str(compiled).lower()}, {precision_name(dtype)}: MFU ratio ours/reference = "
                  f"{results[id(ours)].mfu(peak) / results[id(ref)].mfu(peak):.3f} (tokens/s ratio "
                  f"{results[id(ours)].tokens_per_s / results[id(ref)].tokens_per_s:.3f}); round by round: "
                  f"median {mid:.3f}, middle half {low:.3f}-{high:.3f} over {rounds} rounds")
    if len(dtypes) == 2:
        for compiled in compile_modes:
            for label in (OURS, REFERENCE):
                bf16, fp32 = (runner_for(label, compiled, dtype) for dtype in dtypes)
                if bf16 is None:
                    continue
                # The same model at both precisions: the ratio of step times is that of tokens/s.
                low, mid, high = paired_ratio_quartiles(by_round[id(bf16)], by_round[id(fp32)], 1.0)
                print(f"{label}, compile={str(compiled).lower()}: bf16/fp32 tokens/s = "
                      f"{results[id(bf16)].tokens_per_s / results[id(fp32)].tokens_per_s:.2f}; round by round: "
                      f"median {mid:.2f}, middle half {low:.2f}-{high:.2f} over {rounds} rounds")
    if len(compile_modes) == 2:
        for label in (OURS, REFERENCE):
            for dtype in dtypes:
                eager, comp = (runner_for(label, c, dtype) for c in (False, True))
                if eager is None:
                    continue
                eager, comp = results[id(eager)], results[id(comp)]
                print(f"{label}, {precision_name(dtype)}: compiled/eager tokens/s = "
                      f"{comp.tokens_per_s / eager.tokens_per_s:.2f}, compile cost {comp.first_step_s - eager.first_step_s:.1f}s")
    return 0



def measure_ddp(args: argparse.Namespace) -> int:
    from model.gpt import GPT
    from training.config import load_run_config
    from training.rms_norm_cpu import install_cpu_backward

    cfg = load_run_config(args.config, args.overrides)
    m, tc = cfg.model, cfg.train
    ctx = init_distributed(tc.device)
    try:
        device = ctx.device
        configure_backends(device)
        amp_dtype = resolve_precision(tc.precision if args.precision == "both" else args.precision, device)
        compiled = device.type == "cuda" if args.compile in ("auto", "both") else args.compile == "true"
        common = dict(batch_size=tc.batch_size, block_size=m.block_size, vocab_size=m.vocab_size, device=device,
                      amp_dtype=amp_dtype, compile_model=compiled, train=tc)

        def fresh_model() -> GPT:
            torch.manual_seed(0)
            model = GPT(m)
            install_cpu_backward(model)  # as the trainer does
            return model

        model = fresh_model()
        flops = model.flops_per_token()
        runner = TrainStepRunner("DDP", wrap_model(model.to(device), ctx), flops=flops, **common)
        # The ranks step in lockstep (every step ends in an all-reduce): the slowest sets the pace.
        step_s = max_over_ranks(measure_run(runner, steps=args.steps, warmup=args.warmup).step_s, ctx)
        del runner, model
        # Every rank leaves the group here, together: none is left waiting in a collective while
        # rank 0 works alone below (on a loaded host gloo has aborted a rank in that state).
        shutdown(ctx)
        if not ctx.is_main:
            return 0
        # Alone, so that neither the baseline nor the peak shares the cores with the other ranks.
        peak = measure_peak(device, amp_dtype)
        single = measure_run(TrainStepRunner("1 process", fresh_model().to(device), flops=flops, **common),
                             steps=args.steps, warmup=args.warmup).step_s
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads/process)"
        print(f"device: {name}; backend {ctx.backend or 'none'}; measured {precision_name(amp_dtype)} matmul peak "
              f"{format_flops(peak)}FLOP/s per device")
        print(f"config: {args.config}: {m.n_layer} layers, {m.n_embd} wide, block {m.block_size}, "
              f"micro-batch {tc.batch_size} per process; compile {str(compiled).lower()}; {args.steps} timed steps\n")
        n, tokens = ctx.world_size, tc.batch_size * m.block_size
        rows = [("1 process", 1, single, tokens / single), (f"{n} processes (DDP)", n, step_s, n * tokens / step_s)]
        print(table(("run", "processes", "ms/step", "tok/s (all)", "MFU"),
                    ((label, procs, f"{1e3 * s:.1f}", f"{tps:.0f}", f"{100 * flops * tps / (procs * peak):.1f}%")
                     for label, procs, s, tps in rows)))
        print(f"\nscaling efficiency: {100 * rows[1][3] / (n * rows[0][3]):.0f}% of {n} x the single-process "
              f"tokens/s ({rows[1][3] / rows[0][3]:.2f}x faster)")
        if not ctx.enabled:
            print("(one process only: launch with torchrun --nproc_per_node=N to measure DDP)")
        return 0
    finally:
        shutdown(ctx)


def max_over_ranks(value: float, ctx) -> float:
    if not ctx.enabled:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()

if __name__ == "__main__":
    sys.exit(main())
