"""RMSNorm's CPU training path (training.rms_norm_cpu.RMSNormCPUFunction) against autograd's, and LayerNorm.

    python -m benchmarks.rms_norm_backward --config configs/tiny.yaml
    python -m benchmarks.rms_norm_backward --config configs/tiny.yaml --steps 200

1. One norm's forward and backward on a (batch, block_size, n_embd) activation of the config:
   F.rms_norm differentiated by autograd (what RMSNorm did before), RMSNormCPUFunction, and
   nanoGPT's LayerNorm without bias (one fused kernel each way) for scale.
2. Whole training steps of the config's model (the trainer's own step functions, see
   train_throughput.py) with and without RMSNormCPUFunction, two identical models taking turns,
   so the host's drifting speed hits both alike. Reported: the median of the per-turn ratios.

Timings only; nothing here is a test.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks.shared import benchmark_parser, in_turns
from benchmarks.train_throughput import TrainStepRunner
from common.cli import non_negative_int, positive_int, run_command
from common.device import select_device
from training.device import configure_backends
from training.rms_norm_cpu import install_cpu_backward
from training.rms_norm_cpu import RMSNormCPUFunction


def time_norms(shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    """Median seconds of one forward and backward per variant, the variants taking turns."""
    dim = shape[-1]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    grad = torch.randn(shape, generator=gen)
    weight = torch.nn.Parameter(torch.rand(dim, generator=gen) + 0.5)
    layer_norm = torch.nn.LayerNorm(dim, bias=False)
    variants: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "RMSNorm, autograd over F.rms_norm": lambda t: F.rms_norm(t, (dim,), weight, 1e-5),
        "RMSNorm, RMSNormCPUFunction": lambda t: RMSNormCPUFunction.apply(t, weight, 1e-5),
        "LayerNorm (nanoGPT, no bias)": layer_norm,
    }

    def one_pass(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        fn(x.detach().requires_grad_()).backward(grad)

    passes = {name: partial(one_pass, fn) for name, fn in variants.items()}
    # The first few passes allocate.
    return {name: statistics.median(seconds) for name, seconds in in_turns(passes, repeats, warmup=5).items()}


def time_steps(cfg, device: torch.device, steps: int) -> tuple[float, float, float]:
    """Median step seconds with and without RMSNormCPUFunction, and the median per-turn ratio."""
    from model import GPT

    m, tc = cfg.model, cfg.train
    runners = {}
    for installed in ("with", "without"):
        torch.manual_seed(0)
        model = GPT(m)
        if installed == "with":
            install_cpu_backward(model)
        runners[installed] = TrainStepRunner("", model, flops=model.flops_per_token(), batch_size=tc.batch_size,
                                             block_size=m.block_size, vocab_size=m.vocab_size, device=device,
                                             amp_dtype=torch.float32, compile_model=False, train=tc)
    seconds = in_turns({installed: runner.step for installed, runner in runners.items()}, steps, warmup=3)
    new, old = seconds["with"], seconds["without"]
    # One step per turn, the model without the function as the reference: the ratio is old/new.
    return statistics.median(new), statistics.median(old), statistics.median(o / n for o, n in zip(old, new))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("rms_norm_backward", __doc__)
    parser.add_argument("--config", default="configs/tiny.yaml", help="the shape timed (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=300,
                        help="timed forward+backward passes per norm (default: %(default)s)")
    parser.add_argument("--steps", type=non_negative_int, default=100,
                        help="timed training steps per model; 0 skips them (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    from training.config import load_run_config

    cfg = load_run_config(args.config)
    device = select_device("cpu")
    configure_backends(device)
    m = cfg.model
    shape = (cfg.train.batch_size, m.block_size, m.n_embd)
    print(f"cpu ({torch.get_num_threads()} threads); {args.config}: activation {tuple(shape)}\n")

    norms = time_norms(shape, args.repeats)
    base = norms["RMSNorm, autograd over F.rms_norm"]
    print(f"{'one norm, forward + backward':36} {'ms':>7} {'vs autograd':>12}")
    for name, seconds in norms.items():
        print(f"{name:36} {1e3 * seconds:7.3f} {base / seconds:11.2f}x")

    if args.steps > 0:
        new, old, ratio = time_steps(cfg, device, args.steps)
        print(f"\ntraining step, {args.steps} turns each: {1e3 * new:.1f} ms with RMSNormCPUFunction, "
              f"{1e3 * old:.1f} ms without; per-turn ratio without/with: median {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
