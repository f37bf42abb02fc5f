"""The ``train.py`` command line: parse the flags, train, and say what the run reached and what to do
with it.

Ctrl-C / SIGTERM finish the current step, save a checkpoint and exit with 128 + the signal number;
``--resume`` continues from there. train.py shortens OpenMP's spin before this module (and torch)
is imported."""

import argparse
import shlex
import sys
import time
from pathlib import Path

from common.cli import run_command
from common.errors import DataError, describe_os_error
from common.threads import parse_threads
from data.tokenizer import CHAT_SPECIAL_TOKENS, load_tokenizer
from rundir.files import STATE_FILE, TOKENIZER_FILE
from training.config import Config, load_run_config, with_parent
from training.loss_curve import write_run_loss_curve
from training.result import TrainResult
from training.trainer import train


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
        config = with_parent(load_run_config(args.config, args.overrides))
        result = train(config, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                       threads_setting="train.threads" if args.threads is None else "--threads")
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
        print(done_line(result, time.perf_counter() - started))
        print(summary(result, _draw_loss_curve(result.run_dir, result.kind), chat_tuning=suits_chat_tuning(config),
                      llama_shaped=not config.model.llama_blockers(), tools=tools_learned(config)))
    return 0


def done_line(result: TrainResult, session_seconds: float) -> str:
    """The first line of a finished run: its budget, and how long training took (in this session and,
    for a resumed run, over all of its sessions) beside this session's wall time."""
    tokens = f"{result.tokens_seen:,} tokens"
    if result.epochs is not None:
        tokens += f" ({result.epochs:.1f} epochs of the training split)"
    minutes = (result.train_seconds - result.earlier_seconds) / 60
    if result.earlier_seconds > 0:
        took = (f"{minutes:.1f} min of training in this session ({result.train_seconds / 60:.1f} min over the whole "
                f"run), {session_seconds / 60:.1f} min in all this session")
    else:
        took = f"{minutes:.1f} min of training, {session_seconds / 60:.1f} min in all"
    return (f"done: {result.step} steps ({result.stopped_by}), {tokens}, {took}; final validation {result.val_words}; "
            f"run saved in {result.run_dir}")


def suits_chat_tuning(config: Config) -> bool:
    """Whether configs/tiny-chat.yaml fits this run as a parent: a text run on natural text (the
    synthetic corpus's made-up words share nothing with the plays' exchanges), whose tokenizer
    has the chat tokens (tokenizers from before they were reserved lack them)."""
    if config.data.format != "text" or config.data.source == "synthetic":
        return False
    try:
        tokenizer = load_tokenizer(config.out_dir / TOKENIZER_FILE)
    except DataError:
        return False
    return all(tokenizer.token_to_id(token) is not None for token in CHAT_SPECIAL_TOKENS)


def _draw_loss_curve(run_dir: Path, kind: str) -> Path | None:
    """The run's loss_curve.png, or None with a warning: a failure costs only the picture."""
    try:
        return write_run_loss_curve(run_dir, kind)
    except (OSError, ValueError, ImportError) as e:
        print(f"warning: could not draw the loss curve ({describe_os_error(e) if isinstance(e, OSError) else e})")
        return None


def summary(result: TrainResult, loss_curve: Path | None, *, chat_tuning: bool = True,
            llama_shaped: bool = False, tools: tuple[str, ...] = ()) -> str:
    """What a finished run reached, which weights it kept, where it is, and the commands that use it
    (``next_commands``; ``chat_tuning``: configs/tiny-chat.yaml fits it as a parent; ``llama_shaped``:
    it also exports as a Llama folder and as GGUF)."""
    run = result.run_dir
    lines = [f"final validation: {result.val_words} (the final validation pass, on the kept weights)"]
    if result.val_note:
        lines.append(f"  and {result.val_note}")
    lines.append(kept_line(result))
    if result.starved_share is not None and result.stopped_by == "max_minutes":
        again = "on a quieter machine" + (", or with --threads 1," if result.threads > 1 else "")
        lines.append(
            f"note: other programs held this machine's cores (the run was on a CPU {100 * result.starved_share:.0f}% "
            f"of the time), so train.max_minutes ended it after {result.step} steps, fewer than this machine "
            f"makes when quiet; run it again {again} for the full result"
        )
    if result.adapter:
        lines.append(result.adapter)
    lines.append(f"the run is in {run}" + (f"; {CURVES[result.kind]} {loss_curve}" if loss_curve else ""))
    lines.append("next:")
    lines += [f"  {command}   # {why}" for command, why in next_commands(result, chat_tuning=chat_tuning,
                                                                         llama_shaped=llama_shaped, tools=tools)]
    if result.wandb_sync:
        lines.append(f"wandb logged offline; upload it with: {result.wandb_sync}")
    return "\n".join(lines)


# What each kind of run's loss_curve.png draws (training.loss_curve), as the summary names it.
CURVES = {"text": "its loss curve is", "chat": "its loss curve is",
          "preference": "its DPO loss, rewards/accuracies and rewards/margins are drawn in",
          "rl": "its reward, pass@1 and pass@k are drawn in"}


def tools_learned(config: Config) -> tuple[str, ...]:
    """The tools a run learned to call: its chat replies call them, so generate.py must be given them."""
    if config.data.source == "calculator":
        return ("calculator",)
    return tuple(config.rl.tools) if config.rl is not None else ()


def next_commands(result: TrainResult, *, chat_tuning: bool, llama_shaped: bool,
                  tools: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(command, why) for what a user of this kind of run does next: a text run is sampled and may be
    chat-tuned; a chat run is talked to and its replies measured; a DPO run's replies are compared with
    its parent's; an RL run is asked a question. Every run exports and serves."""
    run = result.run_dir
    chat = f"--chat --tools {' '.join(tools)}" if tools else "--chat"
    if result.kind == "text":
        commands = [
            (f"python generate.py --run {run} --prompt {shlex.quote(result.sample_prompt or 'The')}", "sample from it"),
        ]
        if chat_tuning:
            commands.append((f"python train.py --config configs/tiny-chat.yaml --set train.init_from={run} "
                             f"--set run.out_dir={run}-chat", "chat-tune it on the plays' exchanges"))
    elif result.kind == "rl":
        question = shlex.quote(result.sample_prompt or "What is 2+3?")
        commands = [(f"python generate.py --run {run} {chat} --prompt {question}",
                     "ask it a question of the kind it learned")]
    else:
        commands = [(f"python generate.py --run {run} {chat}", "talk to it")]
        if result.kind == "chat":
            commands.append((f"python -m benchmarks.chat_eval --runs {run}",
                             "how often its replies end their turn, and how often they loop"))
        elif result.parent is not None:
            commands.append((f"python -m benchmarks.chat_eval --runs {result.parent} {run}",
                             "its replies beside its parent's: ended, looping, bits/byte"))
    commands.append((f"python export.py --run {run} --out exports/{run.name}", "a Hugging Face model folder"))
    if llama_shaped:
        commands += [
            (f"python export.py --run {run} --out exports/{run.name}-llama --format llama",
             "a Llama folder, no remote code"),
            (f"python export.py --run {run} --out exports/{run.name}-gguf --format gguf", "one GGUF file for llama.cpp"),
        ]
    commands.append((f"python serve.py --run {run}", "an OpenAI-compatible server"))
    return commands


def kept_line(result: TrainResult) -> str:
    """Which step's weights are the run's model.safetensors, and why (training.kept_model)."""
    if result.kept_score is None:
        return f"kept: the last weights (step {result.kept_step}; no periodic evaluation to compare)"
    scored = f"{result.kept_score} on the evaluation subset"
    if result.kept_step == result.step:
        return f"kept: the last weights (step {result.step}), the best {result.kept_by} seen ({scored})"
    last = f", against {result.last_score} at the last step" if result.last_score is not None else ""
    return (f"kept: the weights of step {result.kept_step}, the best {result.kept_by} seen ({scored}{last}); "
            f"the last state (step {result.step}) stays in {STATE_FILE} for --resume")
