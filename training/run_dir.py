"""A training run's directory, from the trainer's side: claimed and checked before anything slow, and
given the run's own files once every input has been read.

``open_run_dir`` takes the lock, refuses a directory holding another run (unless replaced) or no
checkpoint to resume, and checks a resumed checkpoint (``training.resume_rules``). ``write_run_files``
then clears a replaced run and writes the config, tokenizer and parent record, so a run replaced with
``--overwrite`` stays whole when the new one cannot start. File names and formats belong to ``rundir``."""

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.files import atomic_write_bytes
from model.config import GPTConfig
from rundir.checkpoint import CheckpointError, check_run_dir, clear_old_run, load_trainer_state
from rundir.files import RUN_CONFIG_FILE, TOKENIZER_FILE
from rundir.lock import hold_run_dir
from rundir.metrics import MetricsLog
from training.config import Config, save_config
from training.distributed import DistContext, barrier, decided_on_main
from training.resume_rules import (
    check_data_format, check_fixed_settings, check_model_shape, check_not_finished, check_run_tokenizer,
)

if TYPE_CHECKING:
    from training.init_from import ParentRun


def open_run_dir(config: Config, ctx: DistContext, held: contextlib.ExitStack, *, resume: bool,
                 overwrite: bool) -> dict[str, Any] | None:
    """Claim ``config``'s run directory (the lock goes on ``held``) and, resuming, return its checked
    trainer state. Refused on rank 0, refused on every rank."""
    run_dir = config.out_dir

    def claim() -> None:
        # Taken before anything is read, written or cleared.
        held.enter_context(hold_run_dir(run_dir))
        check_run_dir(run_dir, resume=resume, overwrite=overwrite)

    decided_on_main(ctx, claim)
    state = None
    if resume:
        state = load_trainer_state(run_dir)
        try:
            saved_model = GPTConfig.from_dict(state["model_config"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"checkpoint in {run_dir} has no valid model config ({e})") from None
        check_model_shape(saved_model, config.model, run_dir)
        check_fixed_settings(state, config.train, run_dir)
        check_data_format(run_dir, config.data.format)
        check_run_tokenizer(run_dir)
        check_not_finished(state, config.train, run_dir)
    barrier(ctx)
    return state


def write_run_files(config: Config, metrics: MetricsLog, tokenizer_path: Path, parent: "ParentRun | None", *,
                    resume: bool, step: int) -> None:
    """The run's own files: a replaced run cleared, the config (rewritten on resume: a longer budget
    is a legitimate change), a new run's tokenizer and parent record; a resumed run's metrics lose
    the lines after ``step``."""
    run_dir = config.out_dir
    if not resume:
        clear_old_run(run_dir)  # a run being replaced (--overwrite)
    save_config(config, run_dir / RUN_CONFIG_FILE)
    if resume:
        metrics.truncate_after(step)
    else:
        atomic_write_bytes(run_dir / TOKENIZER_FILE, Path(tokenizer_path).read_bytes())
        if parent is not None:
            from rundir.record import write_parent_record  # a run from a parent records it

            write_parent_record(run_dir, parent.directory, parent.model_config.to_dict(), parent.weights_sha256)
