"""Train a GPT: ``python train.py --config configs/tiny.yaml [--set section.key=value ...]``.

A thin command line over ``training.train``. Ctrl-C / SIGTERM finish the current step, save a
checkpoint and exit with 128 + the signal number; ``--resume`` continues from there.
"""

from __future__ import annotations

from common.signals import quiet_while_starting

with quiet_while_starting():  # first: a Ctrl-C while the libraries load is as quiet as one later
    import argparse
    import shlex
    import sys
    import time
    from pathlib import Path

    from common.threads import calm_openmp_workers, parse_threads

    calm_openmp_workers()  # before the imports below load torch: OpenMP reads its wait policy once
    from common.cli import run_command
    from common.os_errors import describe_os_error
    from training.config import load_run_config
    from training.loss_curve import write_run_loss_curve
    from training.trainer import TrainResult, train


def build_parser() -> argparse.ArgumentParser:
    # Plain argparse: a flag mistake prints the usage with the error, as it always has.
    parser = argparse.ArgumentParser(
        description="Train a GPT from a YAML config; the run directory (run.out_dir) receives the "
        "config, tokenizer, weights, trainer state and metrics.jsonl."
    )
    parser.add_argument("--config", required=True, help="YAML config file, e.g. configs/tiny.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (YAML syntax), e.g. --set train.max_steps=100; repeatable",
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in run.out_dir from its checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in run.out_dir")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or evaluation lines")
    parser.add_argument("--threads", metavar="N|auto",
                        help="CPU threads for torch; sets train.threads (default: the config's, auto: the free CPUs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, _train)


def _train(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.threads is not None:
        threads = parse_threads(args.threads)
        args.overrides.append(f"train.threads={'auto' if threads is None else threads}")
    try:
        config = load_run_config(args.config, args.overrides)
        result = train(config, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress)
    except OSError as e:  # a full disk, a read-only mount: every file already saved is intact
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # A second Ctrl-C (or one during setup): nothing is saved beyond the last checkpoint.
        print("error: interrupted; the last saved checkpoint (if any) is intact", file=sys.stderr)
        return 130
    if result.interrupted:
        if result.is_main:  # under torchrun only rank 0 reports; every rank keeps the exit code
            again = ["python train.py --config", args.config, "--resume"] + [f"--set {o}" for o in args.overrides]
            where = f"stopped at step {result.step}; checkpoint saved in {result.run_dir}"
            print(f"{where}; continue with: {' '.join(again)}", file=sys.stderr)
        return 128 + (result.signal or 2)
    if result.is_main:
        print(
            f"done: {result.step} steps ({result.stopped_by}), {result.tokens_seen:,} tokens, "
            f"{result.train_seconds / 60:.1f} min of training, {(time.perf_counter() - started) / 60:.1f} min in all; "
            f"final val loss {result.val_loss:.4f} nats/token, "
            f"{result.val_bpb:.4f} bits/byte; run saved in {result.run_dir}"
        )
        print(summary(result, _draw_loss_curve(result.run_dir)))
    return 0


def _draw_loss_curve(run_dir: Path) -> Path | None:
    """The run's loss_curve.png, or None with a warning: a failure costs only the picture."""
    try:
        return write_run_loss_curve(run_dir)
    except (OSError, ValueError, ImportError) as e:
        print(f"warning: could not draw the loss curve ({describe_os_error(e) if isinstance(e, OSError) else e})")
        return None


def summary(result: TrainResult, loss_curve: Path | None) -> str:
    """What a finished run reached, where it is, and the commands that use it (sampling from the
    prompt its evaluation samples continued, one that suits its data)."""
    run = result.run_dir
    lines = [f"final validation: {result.val_bpb:.4f} bits/byte{' of assistant text' if result.chat else ''}"]
    if result.starved_share is not None and result.stopped_by == "max_minutes":
        lines.append(
            f"note: other programs held this machine's cores (the run was on a CPU {100 * result.starved_share:.0f}% "
            f"of the time), so train.max_minutes ended it after {result.step} steps, fewer than this machine "
            f"makes when quiet; run it again on a quieter machine, or with --threads 1, for the full result"
        )
    lines.append(f"the run is in {run}" + (f"; its loss curve is {loss_curve}" if loss_curve else ""))
    if result.chat:
        commands = [(f"python generate.py --run {run} --chat", "talk to it")]
    else:
        commands = [
            (f"python generate.py --run {run} --prompt {shlex.quote(result.sample_prompt or 'The')}", "sample from it"),
            (f"python train.py --config configs/tiny-chat.yaml --set train.init_from={run} "
             f"--set run.out_dir={run}-chat", "chat-tune it"),
        ]
    commands += [
        (f"python export.py --run {run} --out exports/{run.name}", "a Hugging Face model folder"),
        (f"python serve.py --run {run}", "an OpenAI-compatible server"),
    ]
    lines.append("next:")
    lines += [f"  {command}   # {why}" for command, why in commands]
    if result.wandb_sync:
        lines.append(f"wandb logged offline; upload it with: {result.wandb_sync}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
