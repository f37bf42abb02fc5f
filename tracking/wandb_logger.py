"""Weights & Biases logging that can neither prompt nor take a training run down, and the ``logging:``
section of a run config that sets it up.

Without credentials it logs offline, since a login prompt would hang a job with no terminal.
Anything wandb raises is reported in one line and turns the logger into a no-op."""

import contextlib
import netrc
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import Field

from common.config import Section
from common.errors import UserError, one_line

WANDB_MODES = ("auto", "online", "offline", "disabled")


class WandbConfig(Section):
    mode: Literal[WANDB_MODES] = "auto"
    project: str = "minigpt"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = []


class LoggingConfig(Section):
    interval: int = Field(10, ge=1, description="steps between lines in metrics.jsonl (and wandb points)")
    wandb: WandbConfig = WandbConfig()


DEFAULT_HOST = "https://api.wandb.ai"

# WANDB_MODE values wandb itself accepts, mapped to ours ("dryrun"/"run" are its old spellings).
_ENV_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def has_credentials(env: dict[str, str] | None = None) -> bool:
    """Whether wandb could log in without asking: an API key in the environment or in netrc
    (wandb's own check ends in a prompt when it finds nothing and a terminal is attached)."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
    # Where wandb and requests look: $NETRC, then ~/.netrc (and ~/_netrc, the Windows name).
    if env.get("NETRC"):
        paths = [Path(env["NETRC"]).expanduser()]
    else:
        home = Path(env.get("HOME") or Path.home())
        paths = [home / ".netrc", home / "_netrc"]
    for path in paths:
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            continue
        if entry and entry[2]:
            return True
    return False


def resolve_mode(requested: str, env: dict[str, str] | None = None) -> tuple[str, str | None]:
    """The mode wandb will run in, and a one-line reason when it differs from the request."""
    env = os.environ if env is None else env
    if requested not in WANDB_MODES:
        raise UserError(f"logging.wandb.mode must be one of {', '.join(WANDB_MODES)}, got {requested!r}")
    mode = requested
    if mode == "auto":
        # WANDB_MODE is how people already switch wandb off (or offline) for one command.
        mode = _ENV_MODES.get(env.get("WANDB_MODE", "").strip().lower())
        if mode is None and not has_credentials(env):
            return "offline", "no W&B credentials found (WANDB_API_KEY or netrc), logging offline"
        mode = mode or "online"
    if mode == "online" and not has_credentials(env):
        return "offline", (
            "online logging asked for but no W&B credentials found (set WANDB_API_KEY or run "
            "`wandb login`), logging offline instead"
        )
    return mode, None


def offline_sync_command(run_dir: str | os.PathLike, run_id: str) -> str:
    """The one shell command that uploads every offline piece of wandb run ``run_id`` in ``run_dir``
    as that one run: wandb gives every process (a ``--resume``, an ``evaluate.py``) its own offline
    folder, which the glob takes, and ``--id`` joins them in the order they started."""
    folder = shlex.quote(str(Path(run_dir) / "wandb"))
    return f"wandb sync --id {shlex.quote(run_id)} {folder}/offline-run-*-{run_id}*"


class WandbLogger:
    """A wandb run owned by the trainer, or a stand-in that accepts the same calls and drops them."""

    def __init__(self, run: Any = None, run_id: str | None = None) -> None:
        self._run = run
        self.run_id = run_id  # stored in the trainer state so that --resume continues this run
        self.sync_command: str | None = None  # logging offline: the command that uploads the run

    @classmethod
    def start(
        cls,
        cfg: WandbConfig,
        *,
        run_dir: str | os.PathLike,
        run_config: dict[str, Any],
        resume_id: str | None = None,
        is_main: bool = True,
    ) -> "WandbLogger":
        """Start (or, given ``resume_id``, continue) the run for ``run_dir``; never raises for
        wandb's sake. When nothing is logged, ``run_id`` still holds ``resume_id``, so a checkpoint
        keeps pointing at the run a later resume should continue."""
        mode, note = resolve_mode(cfg.mode) if is_main else ("disabled", None)
        if mode == "disabled":
            return cls(run_id=resume_id)
        run_dir = Path(run_dir)
        try:
            import wandb  # slow to import (docs/results.md): loaded only when logging is on

            run_dir.mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                name=cfg.name or run_dir.resolve().name,
                tags=list(cfg.tags) or None,
                config=run_config,
                dir=str(run_dir),
                mode=mode,
                id=resume_id,
                # "allow": continue the run with this id if the server has it, else create it.
                resume="allow",
                # Each logger owns its run object; a run left open by an earlier failure in the
                # same process must not be handed back to us under its own id.
                reinit="create_new",
                settings=wandb.Settings(
                    # silent: no banner, and no login prompt either (wandb only prompts when it
                    # may print); console off: tqdm's bars and our prints stay out of the run.
                    silent=True,
                    console="off",
                ),
            )
        except Exception as e:  # noqa: BLE001 - whatever wandb raises, training goes on
            _say(f"wandb: could not start ({one_line(e, with_type=True)}); training continues without wandb", err=True)
            return cls(run_id=resume_id)
        if mode == "offline":
            sync = offline_sync_command(run_dir, run.id)
            _say(f"wandb: {note + '; ' if note else ''}upload later with: {sync}")
        else:
            _say(f"wandb: logging to {run.url}")
            sync = None
        logger = cls(run=run, run_id=run.id)
        logger.sync_command = sync
        return logger

    @property
    def active(self) -> bool:
        return self._run is not None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log scalars at optimizer step ``step`` (steps must not decrease within a run)."""
        if self._run is None:
            return
        try:
            self._run.log(dict(metrics), step=step)
        except Exception as e:  # noqa: BLE001
            self._give_up("log", e)

    def log_samples(self, step: int, rows: list[tuple[str, str]]) -> None:
        """Log generated text as a table of (prompt, completion) rows at ``step``."""
        if self._run is None:
            return
        try:
            import wandb  # slow to import (docs/results.md): loaded only when logging is on

            table = wandb.Table(columns=["prompt", "completion"], data=[[p, c] for p, c in rows])
            self._run.log({"samples": table}, step=step)
        except Exception as e:  # noqa: BLE001
            self._give_up("log samples", e)

    def log_attention_maps(self, key: str, maps: list[Any], tokens: list[str], title: str, step: int) -> None:
        """Draw every layer's attention ``maps`` over ``tokens`` and log the figure under ``key``."""
        if self._run is None:
            return
        try:
            import tempfile

            import wandb  # slow to import (docs/results.md): loaded only when logging is on

            from analysis.plot import draw_attention_grid

            with tempfile.TemporaryDirectory() as folder:
                figure = Path(folder) / "attention.png"
                draw_attention_grid(maps, tokens, figure, title=title)
                self._run.log({key: wandb.Image(str(figure))}, step=step)
        except Exception as e:  # noqa: BLE001
            self._give_up("log an image", e)

    def finish(self, summary: dict[str, Any] | None = None, *, exit_code: int = 0) -> None:
        """Record ``summary`` in the run and close it (idempotent)."""
        run, self._run = self._run, None
        if run is None:
            return
        try:
            for key, value in (summary or {}).items():
                run.summary[key] = value
            run.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001
            _say(f"wandb: could not finish the run ({one_line(e, with_type=True)}); its local files may be incomplete", err=True)

    def _give_up(self, what: str, error: Exception) -> None:
        _say(f"wandb: could not {what} ({one_line(error, with_type=True)}); training continues without wandb", err=True)
        run, self._run = self._run, None
        with contextlib.suppress(Exception):  # already reported; closing is best effort
            run.finish(exit_code=1)


def _say(message: str, *, err: bool = False) -> None:
    print(message, file=sys.stderr if err else sys.stdout, flush=True)
