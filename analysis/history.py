"""A run's attention over its training, as each evaluation logged it (``roles.attention_summary``),
and the evaluations at which the run began to copy (``first_copying``, ``first_*induction``)."""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import read_yaml_file
from common.errors import UserError
from rundir.files import METRICS_FILE, RUN_CONFIG_FILE
from rundir.metrics import read_metrics

# A head passes when at least half its weight lands on the one token the repeat predicts: it then
# reads that token more than every other position together (an even spread scores about 1 / period).
INDUCTION_THRESHOLD = 0.5
# A layer passes when its heads' weights on the predicted token sum to this, above the single
# head's so that a layer of several evenly spread heads stays far below it.
LAYER_INDUCTION_THRESHOLD = 0.6
# The second-copy loss has fallen once it is at most this fraction of the first-copy loss: the
# model then predicts a repeated token far better than a fresh one, which only copying explains.
COPY_LOSS_RATIO = 0.5

_ENTROPY_PREFIX = "attn_entropy_layer"
_LAYER_PREFIX = "induction_layer"


@dataclass(frozen=True)
class AttentionEval:
    step: int
    final: bool  # the evaluation after training ended (kind "final_eval")
    entropy_bits: tuple[float, ...]  # mean attention entropy of each layer, layer 0 first
    induction_best: float
    induction_layers: tuple[float, ...] = ()  # each layer's heads' induction scores summed; () before they were logged
    repeat_loss_first: float | None = None  # None: logged before the repeated-sequence loss was
    repeat_loss_second: float | None = None


def _layered(record: dict[str, Any], prefix: str) -> tuple[float, ...]:
    layers = sorted(int(key[len(prefix):]) for key in record if key.startswith(prefix))
    return tuple(float(record[f"{prefix}{layer}"]) for layer in layers)


def attention_history(records: list[dict[str, Any]]) -> list[AttentionEval]:
    """The evaluations among metrics ``records`` that logged attention statistics, in file order;
    one whose statistics cannot be read is left out, as a damaged line is."""
    history: list[AttentionEval] = []
    for record in _evaluations(records):
        evaluation = _read_evaluation(record)
        if evaluation is None or (history and len(evaluation.entropy_bits) != len(history[0].entropy_bits)):
            continue
        history.append(evaluation)
    return history


def _evaluations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evaluations of the weights as they trained: a final one that scored weights kept from
    an earlier step (training.kept_model) is not a later point of that course."""
    return [r for r in records if r.get("kind") in ("eval", "final_eval") and "induction_best" in r
            and r.get("weights_step", r.get("step")) == r.get("step")]


def _read_evaluation(record: dict[str, Any]) -> AttentionEval | None:
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    entropy = {key[len(_ENTROPY_PREFIX):]: value for key, value in record.items() if key.startswith(_ENTROPY_PREFIX)}
    layers = [str(layer) for layer in range(len(entropy))]
    step = record.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and number(record["induction_best"])
            and entropy and set(entropy) == set(layers) and all(map(number, entropy.values()))):
        return None
    layer_sums = [value for key, value in record.items() if key.startswith(_LAYER_PREFIX)]
    first, second = record.get("repeat_loss_first"), record.get("repeat_loss_second")
    if not all(map(number, layer_sums)) or not all(v is None or number(v) for v in (first, second)):
        return None
    return AttentionEval(step=step, final=record["kind"] == "final_eval",
                         entropy_bits=tuple(float(entropy[layer]) for layer in layers),
                         induction_best=float(record["induction_best"]),
                         induction_layers=_layered(record, _LAYER_PREFIX),
                         repeat_loss_first=None if first is None else float(first),
                         repeat_loss_second=None if second is None else float(second))


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
        raise UserError(f"{path} holds no attention statistics: {_why_no_attention_statistics(run_dir, records)}")
    return history, skipped


def _why_no_attention_statistics(run_dir: Path, records: list[dict[str, Any]]) -> str:
    """Why a run logged no attention statistics, and what to do, from its own config.yaml."""
    try:
        config = read_yaml_file(run_dir / RUN_CONFIG_FILE)
        evaluation, data, model = config["eval"], config["data"], config["model"]
        on = evaluation["attention_stats"]
    except (UserError, KeyError, TypeError):
        return "the run predates them; train it again to log them"
    if not on:
        return "the run was trained with eval.attention_stats: false; train it again with it on"
    if data.get("format") == "chat":
        return "a chat run's evaluations log none; give a run trained on text"
    if not any(r.get("kind") in ("eval", "final_eval") for r in records):
        return "the run has not been evaluated yet; look again after its first evaluation"
    return (f"the run's validation split held less than one window of {model.get('block_size')} tokens "
            "(model.block_size), too little for the probe; train it again with a larger data.val_fraction or "
            "more data")


def first_induction(history: list[AttentionEval], threshold: float = INDUCTION_THRESHOLD) -> AttentionEval | None:
    """The earliest evaluation whose best induction score reaches ``threshold``, or None."""
    return next((e for e in history if e.induction_best >= threshold), None)


def first_layer_induction(history: list[AttentionEval],
                          threshold: float = LAYER_INDUCTION_THRESHOLD) -> AttentionEval | None:
    """The earliest evaluation at which some layer's summed induction score reaches ``threshold``."""
    return next((e for e in history if e.induction_layers and max(e.induction_layers) >= threshold), None)


def has_repeat_loss(history: list[AttentionEval]) -> bool:
    """Whether the run logged the repeated-sequence losses (runs trained before them did not)."""
    return any(e.repeat_loss_second is not None for e in history)


def first_copying(history: list[AttentionEval], ratio: float = COPY_LOSS_RATIO) -> AttentionEval | None:
    """The earliest evaluation whose second-copy loss is at most ``ratio`` times its first-copy loss."""
    return next((e for e in history if e.repeat_loss_second is not None
                 and e.repeat_loss_second <= ratio * e.repeat_loss_first), None)


def format_history(history: list[AttentionEval], threshold: float = INDUCTION_THRESHOLD) -> str:
    """A markdown table, one row per evaluation, then a line each for when the second-copy loss
    fell, a layer passed and a head passed ``threshold`` (or the best reached)."""
    n_layer = max(len(e.entropy_bits) for e in history)
    layers = max(len(e.induction_layers) for e in history)
    losses = has_repeat_loss(history)
    header = ["step", *(f"entropy layer {i} (bits)" for i in range(n_layer)), "induction_best",
              *(f"induction layer {i} (sum)" for i in range(layers)),
              *(["first-copy loss", "second-copy loss"] if losses else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for e in history:
        step = f"{e.step} (final)" if e.final else str(e.step)
        cells = [step, *(f"{h:.3f}" for h in e.entropy_bits), f"{e.induction_best:.3f}",
                 *(f"{s:.3f}" for s in e.induction_layers), *([_nats(e.repeat_loss_first),
                                                                 _nats(e.repeat_loss_second)] if losses else [])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(_copying_line(history))
    if layers:
        lines.append(_layer_line(history))
    lines.append(_head_line(history, threshold))
    return "\n".join(lines)


def _nats(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _copying_line(history: list[AttentionEval]) -> str:
    if not has_repeat_loss(history):
        return ("no repeated-sequence loss: this run's evaluations did not log repeat_loss_first/second (it "
                "predates them); train it again to see when it began to copy")
    fell = first_copying(history)
    if fell is not None:
        return (f"second-copy loss fell: step {fell.step} ({fell.repeat_loss_second:.3f} nats against "
                f"{fell.repeat_loss_first:.3f} on the first copy, <= {COPY_LOSS_RATIO} of it)")
    low = min((e for e in history if e.repeat_loss_second is not None),
              key=lambda e: e.repeat_loss_second / e.repeat_loss_first)
    return (f"second-copy loss did not fall: it stayed above {COPY_LOSS_RATIO} of the first-copy loss (closest "
            f"{low.repeat_loss_second:.3f} against {low.repeat_loss_first:.3f}, at step {low.step})")


def _layer_line(history: list[AttentionEval]) -> str:
    first = first_layer_induction(history)
    if first is not None:
        layer = max(range(len(first.induction_layers)), key=lambda i: first.induction_layers[i])
        return (f"first induction layer: step {first.step} (layer {layer}'s heads sum to "
                f"{first.induction_layers[layer]:.3f} >= {LAYER_INDUCTION_THRESHOLD})")
    best = max((e for e in history if e.induction_layers), key=lambda e: max(e.induction_layers))
    return (f"no induction layer: no layer's heads summed to {LAYER_INDUCTION_THRESHOLD} (highest "
            f"{max(best.induction_layers):.3f}, at step {best.step})")


def _head_line(history: list[AttentionEval], threshold: float) -> str:
    first = first_induction(history, threshold)
    if first is not None:
        return f"first induction head: step {first.step} (induction_best {first.induction_best:.3f} >= {threshold})"
    best = max(history, key=lambda e: e.induction_best)
    return (f"no induction head: induction_best stayed below {threshold} (highest "
            f"{best.induction_best:.3f}, at step {best.step})")
