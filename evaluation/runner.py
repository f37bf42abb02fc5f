"""Evaluate a run: export it, build the tasks from its held-out plays, run lm-eval, keep the results.

The export goes to a hidden folder in TMPDIR that is removed afterwards, so it can never be stale.
The tasks and results stay in the run's ``eval/`` folder, each score beside the score of guessing.
With wandb on, the numbers become summary metrics (``eval/<task>/<metric>``) of the run's own wandb
run when its id is known, else of a new run in the same project."""

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from common.config import build
from common.device import select_device
from common.errors import UserError, with_path
from common.files import atomic_write_text
from data.config import DataConfig
from evaluation.harness import require_lm_eval, results_table, run_lm_eval, summary_metrics
from evaluation.plays import held_out_plays
from evaluation.tasks import BPB_TASK, CHOICES, TASKS, TaskSettings, write_tasks
from exporting.folder import scratch_folder
from exporting.hf import export_run
from rundir.checkpoint import peek_trainer_state
from rundir.files import EVAL_DIR, RUN_CONFIG_FILE
from rundir.record import RunRecord, read_config
from tracking.wandb_logger import LoggingConfig, WandbLogger

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class EvalSettings:
    tasks: tuple[str, ...] = TASKS
    task_settings: TaskSettings = field(default_factory=TaskSettings)
    batch_size: int = 32
    device: str = "auto"
    limit: int | None = None  # lm-eval's --limit: the first N documents of each task
    wandb_mode: str | None = None  # None: the run's logging.wandb.mode
    verbose: bool = False


@dataclass(frozen=True)
class EvalReport:
    table: str  # lm-eval's table
    summary: str  # each score beside its chance level
    metrics: dict[str, float]  # "<task>/<metric>" -> value
    chance: dict[str, float]  # "<task>/<metric>" -> the score of guessing
    train_bpb: float | None  # train.py's last validation bits/byte (metrics.jsonl), for a run trained on text
    results_file: Path


def evaluate_run(run_dir: str | Path, settings: EvalSettings = EvalSettings(),
                 progress: TextIO | None = None) -> EvalReport:
    """Export, build the tasks, score them with lm-eval, save and log the results. ``progress``:
    where a line per stage and a bar per kind of lm-eval request go (None: nowhere)."""
    run_dir = Path(run_dir)

    def stage(message: str) -> None:
        if progress is not None:
            print(message, file=progress, flush=True)

    unknown = [name for name in settings.tasks if name not in TASKS]
    if unknown or not settings.tasks:
        raise UserError(f"unknown task(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(TASKS)}")
    require_lm_eval()
    device = select_device(settings.device, setting="--device")
    stage(f"exporting {run_dir} for lm-eval")
    with _temporary_export(run_dir) as export_dir:  # exporting loads the run: a damaged one stops here
        data, logging_config = _run_sections(run_dir)
        eval_dir = _eval_dir(run_dir)
        stage("building the tasks from the held-out plays")
        try:
            task_dir = write_tasks(held_out_plays(run_dir, data), eval_dir / "tasks", settings.task_settings)
        except OSError as error:
            raise with_path(error, eval_dir) from None
        _check_choices_fit(export_dir, task_dir, settings.tasks)
        chance = chance_levels(export_dir, task_dir, settings.tasks)
        stage(f"scoring {', '.join(settings.tasks)} with lm-eval on {device}")
        results = run_lm_eval(
            export_dir, task_dir, list(settings.tasks), batch_size=settings.batch_size, device=str(device),
            limit=settings.limit, verbose=settings.verbose, progress=progress,
        )
    metrics = summary_metrics(results)
    # A chat run's validation scores its held-out replies, not the plays: nothing to compare with.
    train_bpb = RunRecord.read(run_dir).val_bpb if data.format == "text" else None
    results_file = run_dir / EVAL_DIR / RESULTS_FILE
    saved = {
        "run": str(run_dir),
        "settings": dataclasses.asdict(settings),
        "train_val_bpb": train_bpb,
        "metrics": metrics,
        "chance": chance,
        **{key: results[key] for key in ("results", "versions", "n-samples", "configs") if key in results},
    }
    try:
        atomic_write_text(results_file, json.dumps(saved, indent=2, default=str) + "\n")
    except OSError as error:
        raise with_path(error, results_file) from None
    _log_to_wandb(run_dir, logging_config, settings.wandb_mode, metrics, stage)
    return EvalReport(results_table(results), summary_table(metrics, chance), metrics, chance, train_bpb, results_file)


@contextmanager
def _temporary_export(run_dir: Path) -> Iterator[Path]:
    """The run exported into a hidden folder in TMPDIR, removed when the block ends however it ends."""
    parent = Path(tempfile.gettempdir())
    with ExitStack() as stack:
        try:
            scratch = stack.enter_context(scratch_folder(parent, "minigpt-eval"))
            export_dir = export_run(run_dir, scratch / "export").out_dir
        except OSError as error:
            if not str(error.filename or "").startswith(str(parent)):
                raise  # not TMPDIR's fault (reading the run, say): reported as it is
            raise UserError(f"the run is exported to TMPDIR ({parent}) for lm-eval, and that failed: "
                            f"{error.strerror or error}; set TMPDIR to a folder with room that you can write") from None
        yield export_dir


def _eval_dir(run_dir: Path) -> Path:
    """The run's ``eval/`` folder, made if missing; refused in one line if something else is there."""
    eval_dir = run_dir / EVAL_DIR
    if eval_dir.exists() and not eval_dir.is_dir():
        raise UserError(f"{eval_dir} is a file, where evaluate.py keeps its tasks and results; "
                        "move the file aside and evaluate again")
    try:
        eval_dir.mkdir(exist_ok=True)
    except OSError as error:
        raise with_path(error, eval_dir) from None
    return eval_dir


def chance_levels(export_dir: Path, task_dir: Path, tasks: tuple[str, ...]) -> dict[str, float]:
    """The score of guessing, per ``<task>/<metric>``: one in ``CHOICES``, or for bits per byte a
    uniform distribution over the vocabulary (log2(vocab) bits a token)."""
    chance = {}
    for task in tasks:
        if task != BPB_TASK:
            chance |= {f"{task}/{metric}": 1 / CHOICES for metric in ("acc", "acc_norm", "acc_mutual_info")}
            continue
        from tokenizers import Tokenizer

        vocab = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))["vocab_size"]
        tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
        texts = [json.loads(line)["text"] for line in (task_dir / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()]
        tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch(texts))
        bpb = math.log2(vocab) * tokens / max(1, sum(len(text.encode("utf-8")) for text in texts))
        chance |= {f"{task}/bits_per_byte": bpb, f"{task}/byte_perplexity": 2**bpb}
    return chance


def summary_table(metrics: dict[str, float], chance: dict[str, float]) -> str:
    """One line per score: task, metric, value, its standard error and the chance level."""
    lines = [f"{'task':<24}{'metric':<18}{'score':>12}{'stderr':>10}{'chance':>12}"]
    for name, value in metrics.items():
        task, metric = name.split("/", 1)
        if metric.endswith("_stderr") or metric == "sample_len":  # sample_len counts documents
            continue
        stderr = metrics.get(f"{name}_stderr")
        lines.append(f"{task:<24}{metric:<18}{_number(value):>12}{_number(stderr):>10}{_number(chance.get(name)):>12}")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"


def _check_choices_fit(export_dir: Path, task_dir: Path, tasks: tuple[str, ...]) -> None:
    """Refuse a context window too short for a multiple-choice task: lm-eval scores each choice in
    one window, so the longest choice must fit in it with at least one token of context."""
    from tokenizers import Tokenizer

    block_size = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"]
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    for task in (task for task in tasks if task != BPB_TASK):
        rows = [json.loads(line) for line in (task_dir / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()]
        # lm-eval moves the context's trailing newline into the choice it scores.
        longest = max((len(tokenizer.encode("\n" + choice).ids) for row in rows for choice in row["choices"]), default=0)
        if longest > block_size - 1:
            raise UserError(
                f"{task} has choices of up to {longest} tokens, which does not fit the run's context of "
                f"{block_size} tokens; evaluate only --tasks {BPB_TASK}, or a run with a larger model.block_size"
            )


def _run_sections(run_dir: Path) -> tuple[DataConfig, LoggingConfig]:
    """The ``data:`` and ``logging:`` sections of the run's config.yaml, as written."""
    raw = read_config(run_dir)
    try:
        return build(DataConfig, raw.get("data") or {}, "data"), build(LoggingConfig, raw.get("logging") or {}, "logging")
    except UserError as error:
        raise UserError(f"{run_dir / RUN_CONFIG_FILE} is damaged ({error}); restore the config the run was trained with") from None


def _log_to_wandb(run_dir: Path, logging_config: LoggingConfig, mode: str | None, metrics: dict[str, float],
                  stage: Callable[[str], None]) -> None:
    wandb_config = logging_config.wandb if mode is None else logging_config.wandb.model_copy(update={"mode": mode})
    if wandb_config.mode == "disabled":
        return
    stage(f"logging the scores to wandb ({wandb_config.mode})")
    logger = WandbLogger.start(wandb_config, run_dir=run_dir, run_config={}, resume_id=_wandb_run_id(run_dir))
    logger.finish({f"eval/{name}": value for name, value in metrics.items()})


def _wandb_run_id(run_dir: Path) -> str | None:
    """The training's wandb run id, kept in its trainer state (None: a new wandb run is started)."""
    run_id = peek_trainer_state(run_dir, "wandb_run_id")
    return run_id if isinstance(run_id, str) else None
