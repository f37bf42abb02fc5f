"""The training loop: from a validated ``Config`` to a run directory holding a trained model.

Reproducibility: the model is initialised right after ``torch.manual_seed(train.seed)`` on every
rank (so ranks start identical), then every RNG is reseeded with ``seed + rank`` for dropout. The
batch sampler has its own generator. Everything that consumes randomness is in the trainer state,
so a resumed run replays the uninterrupted one exactly (on the CPU, bit for bit)."""

import contextlib
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from common.errors import UserError
from common.signals import StopNow, StopRequest
from common.threads import use_threads
from inference.sampling import SamplingSettings
from model.gpt import GPT
from model.io import save_pretrained
from rundir.files import METRICS_FILE, TOKENIZER_FILE
from rundir.metrics import MetricsLog
from tracking.wandb_logger import WandbLogger
from training.adapters import Adapters
from training.checkpointing import capture_rng_state, checkpointer_for, restore_rng_state
from training.config import Config, TrainConfig, config_to_dict, with_parent
from training.device import autocast, configure_backends, precision_name, resolve_precision, should_compile
from training.distributed import (
    DistContext, all_reduce_mean, all_reduce_sum, barrier, decided_on_main, gather_to_main, init_distributed,
    select_rank_state, shutdown, split_batch, sync_gradients, wrap_model,
)
from training.evaluate import EvalResult
from training.kept_model import CorpusCheck, KeptModel, epochs, load_kept_weights
from training.memory_budget import check_model_fits, plan_run_memory
from training.metrics import CpuShareWatch, Throughput, format_flops, mfu, peak_flops
from training.optim import build_optimizer, build_schedule, plan_param_groups, set_learning_rate
from training.progress_bar import StepBar
from training.result import TrainResult, batches_line, eval_line, final_words, kept_score, sample_fields
from training.resume_rules import (
    check_resumed_tokenizer, fixed_settings, restore_error, run_precision, threads_on_resume,
)
from training.rms_norm_cpu import install_cpu_backward
from training.run_dir import open_run_dir, write_run_files
from training.tasks.task import prepare_task

# Under a clock budget an evaluation is also due when this fraction of train.max_minutes has passed
# since the last one, so a slow machine that reaches few eval.interval steps still shows samples.
_CLOCK_EVAL_FRACTION = 0.1


def adapters_for(train: TrainConfig) -> Adapters:
    """The adapters of a run with this ``train`` section: LoRA's where ``train.lora`` is set, else none."""
    if train.lora is None:
        return Adapters()
    from training.lora import LoraAdapters  # imported only by a run that asks for it

    return LoraAdapters(train.lora)


class NonFiniteLossError(UserError):
    """The loss or gradient became NaN/Inf; the run stopped without saving."""

    @classmethod
    def at(cls, step: int, loss: float, grad_norm: float, saved_step: int | None, run_dir: Path) -> "NonFiniteLossError":
        return cls(f"training diverged at step {step}: loss {loss}, gradient norm {grad_norm}; stopped without "
                   f"saving, {_what_is_saved(saved_step, run_dir)}; lower train.lr or raise train.warmup_steps")


class StepFailed(UserError):
    """A user's error that showed only inside a training step (a reward function that failed on a
    reply, say); the run stopped without saving."""

    @classmethod
    def at(cls, step: int, error: UserError, saved_step: int | None, run_dir: Path) -> "StepFailed":
        return cls(f"stopped at step {step}: {error}; nothing was saved, {_what_is_saved(saved_step, run_dir)}")


def _what_is_saved(saved_step: int | None, run_dir: Path) -> str:
    if saved_step is None:
        return "no checkpoint had been written yet"
    return f"the last good checkpoint (step {saved_step}) in {run_dir} is untouched"


def train(config: Config, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
          threads_setting: str = "train.threads") -> TrainResult:
    """Train as ``config`` says; ``resume`` continues the run in ``run.out_dir``.

    ``overwrite`` (or ``run.overwrite``) replaces a run already in ``run.out_dir``; without it
    such a directory is refused. ``progress`` shows the progress bar and evaluation lines.
    ``threads_setting`` names where train.threads came from (train.py: ``--threads``)."""
    config = with_parent(config)  # train.init_from's run is read when the run starts
    ctx = init_distributed(config.train.device)
    trainer = Trainer(config, ctx, progress=progress, threads_setting=threads_setting)
    try:
        trainer.setup(resume=resume, overwrite=(overwrite or config.run.overwrite) and not resume)
        return trainer.fit()
    finally:
        trainer.close()
        shutdown(ctx)


def eval_record(result: EvalResult, step: int, elapsed_s: float, *, weights_step: int | None) -> dict[str, Any]:
    """An evaluation's line of the metrics file (a final one says whose weights it scored, ``weights_step``);
    a task scored without text (RL's pass@k) has no bits per byte to keep."""
    record = {"kind": "eval" if weights_step is None else "final_eval", "step": step, "elapsed_s": elapsed_s,
              "val_loss": result.loss, **({"val_bpb": result.bpb} if math.isfinite(result.bpb) else {}),
              "val_tokens": result.tokens, **{f"val_{name}": value for name, value in result.metrics.items()}}
    return record if weights_step is None else {**record, "weights_step": weights_step}


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm`` (0: no clipping); return the norm before."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    # Over FSDP's sharded gradients the norm is a DTensor: the whole model's norm, once gathered.
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class Trainer:
    """One training run; ``setup`` then ``fit``. Attributes are the live state of the run."""

    def __init__(self, config: Config, ctx: DistContext, *, progress: bool = True,
                 threads_setting: str = "train.threads") -> None:
        self.config = config
        self.threads_setting = threads_setting
        self.ctx = ctx
        self.device: torch.device = torch.device(ctx.device)
        self.run_dir = config.out_dir
        self.verbose = progress and ctx.is_main
        self.adapters = adapters_for(config.train)  # how the weights train: all of them, or adapters
        self.step = 0
        self.tokens_seen = 0
        self.base_seconds = 0.0  # training time before this process (from the checkpoint)
        self.saved_step: int | None = None
        self.loop_start = time.perf_counter()
        self.throughput = Throughput()
        self.last_eval_s = 0.0  # training time at the end of the last evaluation
        self.eval_due_by_clock = False
        ec = config.eval
        self.kept = KeptModel(subset=(ec.max_batches, ec.batch_size or config.train.batch_size))
        self.last_subset_loss: float | None = None  # the last periodic evaluation's loss
        self._held = contextlib.ExitStack()  # the run-directory lock, from setup until close

    # -----------------------------------------------------------------------------------------
    # Setup, by stage

    def setup(self, *, resume: bool, overwrite: bool) -> None:
        """Cheapest stages first, so a bad directory or config fails before anything slow; nothing
        in the run directory is written until every input has been read and checked."""
        state = open_run_dir(self.config, self.ctx, self._held, resume=resume, overwrite=overwrite)
        tc = self.config.train
        if (own := threads_on_resume(state, tc.threads)) is not None:
            self.threads = use_threads(own, "the run's own, for an exact resume")
        else:
            self.threads = use_threads(None if tc.threads == "auto" else tc.threads, self.threads_setting)
        self.cpu_share = CpuShareWatch(self.device, self.threads.threads)
        check_model_fits(self.config.model, self.device)  # an absurd size, before anything slow
        # More processes share the configured global batch rather than silently growing it.
        self.split = split_batch(tc.batch_size, tc.grad_accum_steps, self.ctx.world_size)
        self.amp_dtype = resolve_precision(tc.precision, self.device, run_own=run_precision(state, self.device))
        # The whole step's estimate, from the config alone: refused here, before any allocation.
        self.memory_plan = plan_run_memory(self.config, self.device, world_size=self.ctx.world_size,
                                           micro_batch=self.split.batch_size, bf16=self.amp_dtype == torch.bfloat16)
        self._prepare_data(resume=resume)
        self._build_model_and_optimizer()
        wandb_run_id = self._restore(state) if state is not None else None
        self._start_outputs(resume=resume, wandb_run_id=wandb_run_id)

    def _prepare_data(self, *, resume: bool) -> None:
        """The task's data (``training.tasks``); from a parent run (train.init_from), tokenized with
        its tokenizer (this run's own copy when resuming), never a new one."""
        cfg = self.config
        assert (cfg.parent is not None) == bool(cfg.train.init_from), "start runs with train(), or with_parent"
        self.parent = cfg.parent
        tokenizer_file = None
        if self.parent is not None:
            from training.init_from import check_parent_tokenizer  # a run from a parent (train.init_from)

            check_parent_tokenizer(self.parent, cfg.model.vocab_size)
            tokenizer_file = self.run_dir / TOKENIZER_FILE if resume else self.parent.tokenizer_file
        self.task = prepare_task(cfg, tokenizer_file, progress=self.verbose, is_main=self.ctx.is_main,
                                 device=self.device, adapters=self.adapters, resume=resume)
        barrier(self.ctx)
        if resume:
            check_resumed_tokenizer(self.run_dir, self.task.tokenizer)
        self.probe = self.task.attention_probe(cfg.model.block_size, self.device) if cfg.eval.attention_stats else None

    def _build_model_and_optimizer(self) -> None:
        cfg, tc, ctx = self.config, self.config.train, self.ctx
        configure_backends(self.device)
        # Measured (on the CPU) before seeding, with its own generator anyway.
        self.peak, self.peak_source = peak_flops(tc.peak_flops, self.device, self.amp_dtype)

        torch.manual_seed(tc.seed)
        self.model = GPT(cfg.model).to(self.device)
        install_cpu_backward(self.model)  # a faster RMSNorm backward in eager CPU training
        if self.parent is not None:
            from training.init_from import load_parent_weights

            load_parent_weights(self.model, self.parent)  # a resumed run's checkpoint replaces them
        self.adapters.apply(self.model, self.task.tokenizer)
        if tc.activation_checkpointing:
            from training.recompute import checkpoint_blocks  # imported only by a run that asks for it
            checkpoint_blocks(self.model)
        # Before the optimizer is built: FSDP replaces the parameters with sharded ones.
        self.wrapped = wrap_model(self.model, ctx, tc.parallel)
        self.checkpoint = checkpointer_for(tc.parallel, self.run_dir, ctx, cfg.model, self.device, self.adapters)
        torch.manual_seed(tc.seed + ctx.rank)  # for dropout, differing per rank
        np.random.seed((tc.seed + ctx.rank) % 2**32)
        random.seed(tc.seed + ctx.rank)
        # Each group's learning-rate scale comes from the config, never a checkpoint, so a resume may change it.
        self.param_groups = plan_param_groups(self.model, tc)
        self.optimizer = build_optimizer(self.param_groups, tc, self.device)
        # Positions computed per step, at most: every row of every example fills the window.
        self.tokens_per_step = tc.batch_size * tc.grad_accum_steps * cfg.rows_per_example * cfg.model.block_size
        self.schedule = build_schedule(tc, self.tokens_per_step)
        self.steps_per_epoch = self.task.steps_per_epoch(tc.batch_size * tc.grad_accum_steps)
        self.corpus_check = CorpusCheck(self.steps_per_epoch, self.tokens_per_step, tc.max_tokens, self.task.words)
        self.batches = self.task.batches(self.split.batch_size, seed=tc.seed, rank=ctx.rank,
                                         world_size=ctx.world_size, device=self.device)
        self.compiled = should_compile(tc.compile, self.device)
        self.train_model = torch.compile(self.wrapped) if self.compiled else self.wrapped
        self.flops_per_token = self.model.flops_per_token(cfg.model.block_size)

    def _restore(self, state: dict[str, Any]) -> str | None:
        """Load a checkpoint's trainer state; return the wandb run id to resume."""
        try:
            self.checkpoint.restore(state, self.model, self.optimizer)
            self.step = int(state["step"])
            self.tokens_seen = int(state["tokens_seen"])
            self.base_seconds = float(state["train_seconds"])
            rank_state, message = select_rank_state(state["ranks"], state["world_size"], self.ctx)
            if rank_state is not None:
                self.batches.load_state_dict(rank_state["batches"])
                # Before tasks had a state, an RL run kept its pending rollout with its batches.
                self.task.load_state_dict(rank_state.get("task", rank_state["batches"]))
                restore_rng_state(rank_state["rng"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            # A state with keys missing, or saved by another optimizer or sampler.
            raise restore_error(self.run_dir, e) from None
        self.saved_step = self.step
        self.kept.load_state_dict(state.get("kept"))
        if rank_state is None and message and self.ctx.is_main:
            self._say(f"warning: {message}")
        return state.get("wandb_run_id")

    def _start_outputs(self, *, resume: bool, wandb_run_id: str | None) -> None:
        cfg = self.config
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE)
        decided_on_main(self.ctx, lambda: write_run_files(cfg, self.metrics, self.task.prepared.tokenizer_path,
                                                          self.parent, resume=resume, step=self.step))
        self.logger = WandbLogger.start(
            cfg.logging.wandb, run_dir=self.run_dir, run_config=config_to_dict(cfg), resume_id=wandb_run_id,
            is_main=self.ctx.is_main,
        )
        if self.verbose:
            self._say(
                f"{'resuming' if resume else 'training'} {self.adapters.trained(self.model)} on {self.device} "
                f"({precision_name(self.amp_dtype)}{', compiled' if self.compiled else ''}); "
                f"{self.tokens_per_step} tokens/step; MFU against {format_flops(self.peak)}FLOP/s ({self.peak_source}); "
                f"{self.threads.describe()}; run dir {self.run_dir}"
            )
            self._say(self.memory_plan)
            if self.parent is not None:
                self._say(f"starting from {self.parent.directory}")
            for line in (self.adapters.describe(self.model), batches_line(self.task.words, self.batches)):
                if line is not None:
                    self._say(line)
        if self.ctx.is_main and (warning := self.task.words.warning) is not None:
            self._say(warning)

    def close(self) -> None:
        """Release the run directory (after the last file is written, or after a failure)."""
        self._held.close()

    # -----------------------------------------------------------------------------------------
    # The loop

    def fit(self) -> TrainResult:
        """The training loop: until a budget is used up or a signal asks to stop, set the learning
        rates, accumulate one step's gradient (``self.task`` makes the loss), clip it, refuse a
        non-finite loss, step; log, evaluate and save on their intervals. The last weights' evaluation,
        a checkpoint and the kept weights' full validation pass (``training.kept_model``) end the run."""
        tc, cfg = self.config.train, self.config
        stop = StopRequest()
        stop.install()
        self.loop_start = time.perf_counter()
        self.last_eval_s = self.base_seconds
        loss = result = None
        try:
            with StepBar(self.schedule, self.throughput, self._mfu, step=self.step, elapsed_s=self._elapsed(),
                         enabled=self.verbose) as bar:
                while (reason := self._stop_reason(stop)) is None:
                    t0, cpu0 = time.perf_counter(), time.thread_time()
                    lr = self.schedule(self.step, self._elapsed())
                    set_learning_rate(self.optimizer, self.param_groups, lr, tc.muon_momentum)
                    try:
                        step_loss, tokens = self.task.accumulate(
                            self.train_model, self.batches, self.split.micro_steps, ctx=self.ctx, stop=stop,
                            amp=lambda: autocast(self.device, self.amp_dtype),
                            sync=lambda last: sync_gradients(self.wrapped, last),
                        )
                    except UserError as e:  # the task's own check of what the user gave it (a reward)
                        raise StepFailed.at(self.step + 1, e, self.saved_step, self.run_dir) from None
                    if step_loss is None:  # a stop request abandoned the step; the batches are rewound
                        self.optimizer.zero_grad(set_to_none=True)
                        reason = "interrupted"
                        break
                    grad_norm = clip_gradients(self.model, tc.grad_clip)
                    # One host sync per step: the cost of catching a NaN before the optimizer does.
                    loss, grad_norm = all_reduce_mean(step_loss, self.ctx).item(), grad_norm.item()
                    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                        self.optimizer.zero_grad(set_to_none=True)
                        raise NonFiniteLossError.at(self.step + 1, loss, grad_norm, self.saved_step, self.run_dir)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.step += 1
                    self.tokens_seen += tokens
                    self.throughput.add(tokens, time.perf_counter() - t0, time.thread_time() - cpu0)
                    if (advice := self.cpu_share.advice(self.throughput)) is not None and self.verbose:
                        self._say(advice)

                    bar.advance(self.step, self._elapsed(), loss, lr)
                    if (warning := self.corpus_check.warning(bar, self.step, self._elapsed())) and self.ctx.is_main:
                        self._say(warning)
                    if self.step % cfg.logging.interval == 0 or self.step == 1:
                        self._log_train(loss, lr, grad_norm)
                    if cfg.eval.interval and (self.step % cfg.eval.interval == 0 or self.eval_due_by_clock):
                        self._evaluate(final=False)
                    if cfg.run.checkpoint_interval and self.step % cfg.run.checkpoint_interval == 0:
                        self._save()
                if reason != "interrupted":
                    bar.complete(self.step)
                    if self.kept.evaluated_step not in (None, self.step):
                        self._evaluate(final=False)  # the last weights compete for the kept model too
                if self.saved_step != self.step:
                    self._save()
            result = self._finish(reason, loss, stop)
            return result
        finally:
            stop.restore()
            # A diverged or crashed run shows as failed in wandb; its files are closed either way.
            self.logger.finish(result.summary() if result else {}, exit_code=1 if result is None else 0)

    def _finish(self, reason: str, last_loss: float | None, stop: StopRequest) -> TrainResult:
        """The result of the run, with the full validation pass unless it was interrupted."""
        result = TrainResult(
            run_dir=self.run_dir, step=self.step, tokens_seen=self.tokens_seen, stopped_by=reason,
            train_seconds=self._elapsed(), last_loss=last_loss, signal=stop.signum, is_main=self.ctx.is_main,
            kind=self.config.data.format, parent=self.parent.directory if self.parent is not None else None,
            wandb_sync=self.logger.sync_command, starved_share=self.cpu_share.starved_share,
            sample_prompt=self.task.sample_prompt, kept_step=self._kept_step(), kept_val_loss=self.kept.val_loss,
            last_val_loss=self.last_subset_loss if self.kept.evaluated_step == self.step else None,
            threads=self.threads.threads, earlier_seconds=self.base_seconds,
            epochs=epochs(self.step, self.steps_per_epoch), kept_by=self.task.words.kept_by,
        )
        result.kept_score, result.last_score = (None if loss is None else kept_score(self.task.words, loss)
                                                for loss in (result.kept_val_loss, result.last_val_loss))
        if self.ctx.is_main and (report := self.adapters.report(self.model, self.run_dir)) is not None:
            result.adapter, result.adapter_numbers = report
        if reason != "interrupted":
            # Everything is saved: a signal now skips the final validation, and says so.
            stop.raise_on_signal = True
            try:
                if self.kept.step not in (None, self.step):  # the last state is saved for --resume
                    barrier(self.ctx)
                    load_kept_weights(self.model, self.run_dir, self.adapters)
                final = self._evaluate(final=True)
            except StopNow:
                result.stopped_by, result.signal = "interrupted", stop.signum
            else:
                result.val_loss, result.val_bpb = final.loss, final.bpb
                result.val_words, result.val_note = final_words(self.task.words, final)
        return result

    def _stop_reason(self, stop: StopRequest) -> str | None:
        """Why to stop before the next step, agreed by every rank (a signal may reach only some)."""
        tc = self.config.train
        interrupted = stop.requested
        self.eval_due_by_clock = self._clock_eval_due()
        reason = tc.budget_reached(self.step, self.tokens_seen, self._elapsed())
        if self.ctx.enabled:
            flags = [float(interrupted), float(reason == "max_minutes"), float(self.eval_due_by_clock)]
            flags = all_reduce_sum(torch.tensor(flags, device=self.device), self.ctx).tolist()
            interrupted = flags[0] > 0
            if reason is None and flags[1] > 0:
                reason = "max_minutes"
            self.eval_due_by_clock = flags[2] > 0  # every rank evaluates, or none does
        return "interrupted" if interrupted else reason

    # -----------------------------------------------------------------------------------------
    # Logging, evaluation, checkpoints

    def _log_train(self, loss: float, lr: float, grad_norm: float) -> None:
        tokens_per_s = self.throughput.tokens_per_second()
        record = {"kind": "train", "step": self.step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens": self.tokens_seen, "tokens_per_s": tokens_per_s, "mfu": self._mfu(tokens_per_s),
                  "elapsed_s": self._elapsed(), **self.task.train_fields(self.batches)}
        if self.ctx.is_main:
            self.metrics.append(record)
            self.logger.log({f"train/{k}": v for k, v in record.items() if k not in ("kind", "step")}, self.step)

    def _evaluate(self, *, final: bool) -> EvalResult:
        cfg, ec = self.config, self.config.eval
        result = self.task.evaluate(
            self.model,
            batch_size=ec.batch_size or cfg.train.batch_size,
            max_batches=ec.final_max_batches if final else ec.max_batches,
            device=self.device,
            amp=None,  # in fp32 whatever the training precision: bits/byte compare between runs
            ctx=self.ctx,
            progress=final and self.verbose,  # the full pass can take minutes on a slow host
        )
        if not final:
            self.last_subset_loss = result.loss
        keep = not final and self.kept.record(self.step, result.loss)  # the same on every rank
        # Samples, attention maps, the kept weights and final measures are rank 0's: a sharded model is gathered.
        needed = ec.sample_tokens > 0 or self.probe is not None or keep or final
        plain = self.checkpoint.whole_model(self.model) if needed else None
        if keep:  # a full disk is every rank's one line, as for a checkpoint
            decided_on_main(self.ctx, lambda: self._write_kept_weights(plain))
        if not self.ctx.is_main:
            self.last_eval_s = self._elapsed()
            return result
        if final:
            result.metrics.update(self.task.final_metrics(plain))
        record = eval_record(result, self.step, self._elapsed(), weights_step=self._kept_step() if final else None)
        samples = self.task.samples(plain, SamplingSettings(
            max_new_tokens=ec.sample_tokens, temperature=ec.sample_temperature, top_k=ec.sample_top_k, top_p=None,
            seed=ec.sample_seed)) if ec.sample_tokens > 0 else []
        record.update(sample_fields(self.task.words, samples))
        if self.probe is not None:
            record.update(self.probe.record(plain, self.logger, self.step, self.task.tokenizer, final=final,
                                            image_interval=ec.attention_image_interval))
        self.metrics.append(record)
        prefix = "final/" if final else "val/"
        self.logger.log({prefix + name.removeprefix("val_"): value for name, value in record.items()
                         if name.startswith("val_") and name != "val_tokens"}, self.step)
        if samples:
            self.logger.log_samples(self.step, samples)
        if self.verbose and not final:
            self._say(eval_line(self.task.words, "validation", self.step, result, samples))
        elif self.verbose:  # the kept weights' samples were shown at their own evaluation (the same seeds)
            kept = self._kept_step()
            scope = "full validation" + (f" (the weights of step {kept})" if kept != self.step else "")
            shown = [] if self.kept.step is not None else samples
            self._say(eval_line(self.task.words, scope, self.step, result, shown))
        self.last_eval_s = self._elapsed()
        return result

    def _write_kept_weights(self, plain: GPT) -> None:
        save_pretrained(self.adapters.merged(plain), self.run_dir)
        self.adapters.save(self.run_dir, plain)  # the adapters' files follow the kept weights

    def _save(self) -> None:
        # Each rank's sampler and RNG streams differ, and all are needed to resume exactly.
        ranks = gather_to_main({"rng": capture_rng_state(), "batches": self.batches.state_dict(),
                                "task": self.task.state_dict()}, self.ctx)
        state = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_seconds": self._elapsed(),
            "model_config": self.config.model.to_dict(),
            "ranks": ranks,
            "world_size": self.ctx.world_size,
            "wandb_run_id": self.logger.run_id,
            "fixed_settings": fixed_settings(self.config.train),
            "threads": self.threads.threads,
            "precision": precision_name(self.amp_dtype),
            "kept": self.kept.state_dict(),
        }
        # Once an evaluation has kept weights, model.safetensors holds them, not the latest.
        weights = self.kept.step is None
        if weights and self.ctx.is_main:
            self.adapters.save(self.run_dir, self.model)
        self.checkpoint.save(self.model, self.optimizer, state, weights=weights)
        self.saved_step = self.step

    # -----------------------------------------------------------------------------------------
    # Small helpers

    def _elapsed(self) -> float:
        return self.base_seconds + time.perf_counter() - self.loop_start

    def _clock_eval_due(self) -> bool:
        max_seconds = self.schedule.max_seconds
        if max_seconds is None or not self.config.eval.interval:
            return False
        elapsed, interval = self._elapsed(), _CLOCK_EVAL_FRACTION * max_seconds
        # Not in the last half-interval: the last weights are evaluated when the clock ends the run, a
        # moment later, and with the learning rate near its end they are the same weights.
        return elapsed - self.last_eval_s >= interval and max_seconds - elapsed > interval / 2

    def _mfu(self, tokens_per_s: float) -> float:
        return mfu(self.flops_per_token, tokens_per_s, self.peak * self.ctx.world_size)

    def _kept_step(self) -> int:
        """The step whose weights are the run's model: the best evaluated, else the latest."""
        return self.step if self.kept.step is None else self.kept.step

    def _say(self, message: str) -> None:
        tqdm.write(message, file=sys.stdout)
