"""A run's attention over its training: what each evaluation logged to ``metrics.jsonl`` (each
layer's mean attention entropy and the best induction score over heads, see ``maps.attention_summary``),
and the first evaluation at which an induction head had appeared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from rundir.files import METRICS_FILE
from rundir.metrics import read_metrics

# A head passes when at least half its weight lands on the one token the repeat predicts: then it
# reads that token more than every other visible position put together, so its output is mostly
# the copied token. A head that spreads evenly scores about 1 / period, far below; a threshold
# that does not depend on the window length can be read the same way for any run.
INDUCTION_THRESHOLD = 0.5

_ENTROPY_PREFIX = "attn_entropy_layer"


@dataclass(frozen=True)
class AttentionEval:
    step: int
    final: bool  # the evaluation after training ended (kind "final_eval")
    entropy_bits: tuple[float, ...]  # mean attention entropy of each layer, layer 0 first
    induction_best: float


def attention_history(records: list[dict[str, Any]]) -> list[AttentionEval]:
    """The evaluations among metrics ``records`` that logged attention statistics, in file order.

    An evaluation whose statistics cannot be read (a step or a score that is not a number, layers
    missing or fewer than the first readable one's) is left out, as a damaged line is."""
    history: list[AttentionEval] = []
    for record in _evaluations(records):
        evaluation = _read_evaluation(record)
        if evaluation is None or (history and len(evaluation.entropy_bits) != len(history[0].entropy_bits)):
            continue
        history.append(evaluation)
    return history


def _evaluations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") in ("eval", "final_eval") and "induction_best" in r]


def _read_evaluation(record: dict[str, Any]) -> AttentionEval | None:
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    entropy = {key[len(_ENTROPY_PREFIX):]: value for key, value in record.items() if key.startswith(_ENTROPY_PREFIX)}
    layers = [str(layer) for layer in range(len(entropy))]
    step = record.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and number(record["induction_best"])
            and entropy and set(entropy) == set(layers) and all(map(number, entropy.values()))):
        return None
    return AttentionEval(step=step, final=record["kind"] == "final_eval",
                         entropy_bits=tuple(float(entropy[layer]) for layer in layers),
                         induction_best=float(record["induction_best"]))


def read_attention_history(run_dir: Path) -> tuple[list[AttentionEval], int]:
    """``attention_history`` of the run in ``run_dir``, and how many evaluations with attention
    statistics it had to leave out; a run without any readable one is a ``UserError``."""
    path = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise UserError(f"--run {run_dir} does not exist; give a run directory written by train.py")
    if not path.is_file():
        raise UserError(f"{run_dir} has no {METRICS_FILE}; give a run directory written by train.py")
    records = read_metrics(path)
    history = attention_history(records)
    skipped = len(_evaluations(records)) - len(history)
    if not history:
        raise UserError(f"{path} holds no attention statistics (the run predates them or was trained with "
                        "eval.attention_stats: false); train it again to log them")
    return history, skipped


def first_induction(history: list[AttentionEval], threshold: float = INDUCTION_THRESHOLD) -> AttentionEval | None:
    """The earliest evaluation whose best induction score reaches ``threshold``, or None."""
    return next((e for e in history if e.induction_best >= threshold), None)


def format_history(history: list[AttentionEval], threshold: float = INDUCTION_THRESHOLD) -> str:
    """A markdown table, one row per evaluation, and a line naming the step an induction head
    first appeared at (or the best score reached, if none did)."""
    n_layer = max(len(e.entropy_bits) for e in history)
    header = ["step", *(f"entropy layer {i} (bits)" for i in range(n_layer)), "induction_best"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for e in history:
        step = f"{e.step} (final)" if e.final else str(e.step)
        cells = [step, *(f"{h:.3f}" for h in e.entropy_bits), f"{e.induction_best:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    first = first_induction(history, threshold)
    if first is not None:
        lines.append(f"\nfirst induction head: step {first.step} (induction_best {first.induction_best:.3f} "
                     f">= {threshold})")
    else:
        best = max(history, key=lambda e: e.induction_best)
        lines.append(f"\nno induction head: induction_best stayed below {threshold} (highest "
                     f"{best.induction_best:.3f}, at step {best.step})")
    return "\n".join(lines)
