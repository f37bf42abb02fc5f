"""What every benchmark shares, so that each adds only its measurement; tables are markdown, as
docs/results.md holds them. A helper, not a benchmark: it has no command line."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeAlias

from common.cli import ArgumentParser
from common.errors import UserError

if TYPE_CHECKING:  # the engine's types only: a benchmark that drives no engine does not import it
    from inference.engine import Engine, Event, Finish
    from inference.sampling import SamplingSettings

ROOT = Path(__file__).resolve().parents[1]


def benchmark_parser(module: str, doc: str, **options) -> ArgumentParser:
    """The parser of ``python -m benchmarks.<module>``, described by its docstring's first paragraph."""
    return ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.split("\n\n")[0], **options)


def add_set_flag(parser: argparse.ArgumentParser) -> None:
    """``--set SECTION.KEY=VALUE``, repeatable, as train.py takes it (``args.set``)."""
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a train.py override (e.g. eval.final_max_batches=4); repeatable (default: none)")


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


def final_eval(run_dir: Path) -> tuple[int, float] | None:
    """(steps, val bits/byte) from the run's final evaluation record; None if it has none (yet)."""
    from rundir.files import METRICS_FILE

    metrics = run_dir / METRICS_FILE
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    finals = [record for record in map(json.loads, filter(str.strip, lines)) if record.get("kind") == "final_eval"]
    return (finals[-1]["step"], finals[-1]["val_bpb"]) if finals else None


def in_turns(calls: dict[str, Callable[[], object]], rounds: int, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds of each call in each of ``rounds`` rounds, after ``warmup`` untimed ones. The calls
    take turns, one each per round: on a shared machine the load drifts, and turns spread a busy
    spell over every call alike instead of penalising whichever ran during it."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(warmup + rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if i >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def best_seconds(call: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """The fastest of ``repeats`` timings of ``call()``: on a shared machine other processes only ever
    slow a run down, so the best is the closest to the code's own speed. ``sync`` waits for a device's
    queued work, before the clock starts and before it stops."""
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        call()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def paired_ratio(mine: Sequence[float], peer: Sequence[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of ``mine / peer`` taken round by round. Both ran in the same round,
    under the same load, so each ratio compares like with like; the best of two series may come from
    different rounds, one quiet and one busy."""
    ratios = sorted(m / p for m, p in zip(mine, peer, strict=True))
    return statistics.median(ratios), ratios[0], ratios[-1]


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``values``, by rank: the middle half of a spread."""
    ranked = sorted(values)
    n = len(ranked)
    return ranked[n // 4], ranked[n // 2], ranked[(3 * n) // 4]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def table_head(*columns: str, left: int = 1) -> str:
    """A markdown table's header and rule; the first ``left`` columns align left, the rest (figures) right."""
    return "| " + " | ".join(columns) + " |\n|" + "---|" * left + "---:|" * (len(columns) - left)


def table_row(*cells: object) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1) -> str:
    return "\n".join([table_head(*columns, left=left), *(table_row(*row) for row in rows)])


def print_rows(columns: Sequence[str], rows: Iterable[tuple[dict, Sequence[object]]], as_json: bool,
               left: int = 1) -> None:
    """Each row as it comes, as a JSON object (``--json``) or a table row under ``columns``; a row
    is (its record, its cells). Flushed, so a long lab shows each row when it is done; the table's
    head comes with the first row, so a command that fails before it prints no empty table."""
    for i, (record, cells) in enumerate(rows):
        if i == 0 and not as_json:
            print(table_head(*columns, left=left))
        print(json.dumps(record) if as_json else table_row(*cells), flush=True)


def api_settings(max_tokens: int, temperature: float = 1.0, top_p: float = 1.0, **options) -> SamplingSettings:
    """Sampling settings with the server's (OpenAI's) defaults, as serving.api builds them."""
    from inference.sampling import SamplingSettings

    return SamplingSettings(max_new_tokens=max_tokens, temperature=temperature, top_k=None, top_p=top_p, **options)


@dataclass
class Timing:
    """One request's clock: when it was sent, when each token (or text chunk) came, tokens generated."""

    submitted: float
    stamps: list[float] = field(default_factory=list)
    tokens: int = 0


Request: TypeAlias = "tuple[Sequence[int], SamplingSettings, Sequence[int]]"  # prompt ids, settings, end ids


def closed_loop(engine: Engine, clients: int, next_request: Callable[[int, Finish | None], Request | None],
                ) -> tuple[list[Timing], float]:
    """Closed-loop clients of ``engine``: client c sends ``next_request(c, None)``, then, each time its
    request finishes, ``next_request(c, finish)``, until that returns None. Returns every request's
    timing and the seconds until the last one finished. An error in a client (on the engine's
    thread, which would only log it and leave this waiting) is raised here."""
    timings: list[Timing] = []
    lock, done = threading.Lock(), threading.Event()
    failures: list[BaseException] = []
    waiting = [clients]

    def send(client: int, finish: Finish | None) -> None:
        with lock:
            request = next_request(client, finish)
            if request is None:
                waiting[0] -= 1
                if waiting[0] == 0:
                    done.set()
                return
            timing = Timing(time.perf_counter())
            timings.append(timing)

        def on_event(event: Event) -> None:
            try:
                if event.token_id is not None:
                    timing.stamps.append(time.perf_counter())
                if event.finish is not None:
                    timing.tokens = event.finish.completion_tokens
                    send(client, event.finish)
            except BaseException as error:
                failures.append(error)
                done.set()

        ids, settings, end_ids = request
        engine.submit(ids, settings, on_event, end_ids)

    start = time.perf_counter()
    for client in range(clients):
        send(client, None)
    done.wait()
    if failures:
        raise failures[0]
    return timings, time.perf_counter() - start


def ms_quantiles(values: list[float]) -> str:
    """``p50 / p95`` of ``values`` (seconds) in milliseconds, or ``-`` with fewer than two."""
    if len(values) < 2:
        return "-"
    cuts = statistics.quantiles(values, n=20)
    return f"{statistics.median(values) * 1e3:.1f} / {cuts[18] * 1e3:.1f}"
