"""Experiment 4, when an induction head appeared: attention statistics read back from metrics.jsonl."""

import json

import pytest
import yaml

from analysis.cli import main
from analysis.history import (INDUCTION_THRESHOLD, AttentionEval, attention_history, first_copying, first_induction,
    first_layer_induction, format_history, read_attention_history)
from common.errors import UserError
from test_attention_cli import is_png


def evaluation(step, induction, kind="eval", entropy=(5.0, 4.0)):
    record = {"kind": kind, "step": step, "val_loss": 3.0, "induction_best": induction}
    record.update({f"attn_entropy_layer{i}": h for i, h in enumerate(entropy)})
    return record


RECORDS = [
    {"kind": "train", "step": 10, "loss": 5.0},
    {"kind": "eval", "step": 50, "val_loss": 4.0},  # logged before the attention statistics existed
    evaluation(100, 0.01),
    {"kind": "train", "step": 110, "loss": 4.0},
    evaluation(200, 0.49),
    evaluation(300, 0.62, entropy=(5.1, 3.2)),
    evaluation(400, 0.30),
    evaluation(400, 0.71, kind="final_eval"),
]


def test_only_evaluations_with_attention_statistics_are_read():
    history = attention_history(RECORDS)
    assert [(e.step, e.final) for e in history] == [(100, False), (200, False), (300, False), (400, False),
                                                  (400, True)]
    assert history[2] == AttentionEval(step=300, final=False, entropy_bits=(5.1, 3.2), induction_best=0.62)
    record = evaluation(10, 0.0, entropy=[float(i) for i in range(12)])  # layers in order, not key order
    assert attention_history([dict(reversed(list(record.items())))])[0].entropy_bits == tuple(map(float, range(12)))
    # A final evaluation of weights kept from an earlier step is not a later point.
    kept_earlier = {**evaluation(400, 0.62, kind="final_eval"), "weights_step": 300}
    history = attention_history([*RECORDS[:-1], kept_earlier])
    assert [(e.step, e.final) for e in history] == [(100, False), (200, False), (300, False), (400, False)]
    kept_last = {**evaluation(400, 0.71, kind="final_eval"), "weights_step": 400}
    assert [e.final for e in attention_history([*RECORDS[:-1], kept_last])][-1]


def test_the_first_evaluation_past_the_threshold_and_the_table_naming_it():
    table = format_history(attention_history(RECORDS))
    assert "| 400 (final) | 5.000 | 4.000 | 0.710 |" in table
    assert table.endswith("first induction head: step 300 (induction_best 0.620 >= 0.5)")
    none = format_history(attention_history(RECORDS[:5]))
    assert none.endswith("no induction head: induction_best stayed below 0.5 (highest 0.490, at step 200)")
    # This run logged no repeated-sequence loss, nor layer sums: no column, no line.
    assert "no repeated-sequence loss: this run's evaluations did not log" in table and "induction layer" not in table
    history = attention_history(RECORDS)
    assert first_induction(history).step == 300  # 0.49 at step 200 is below the default of 0.5
    assert first_induction(history, threshold=0.49).step == 200  # reaching the threshold counts
    assert first_induction(history, threshold=0.7).final
    assert first_induction(history, threshold=0.9) is None
    assert INDUCTION_THRESHOLD == 0.5


def copying(step, layers, first, second, best=0.3):
    """An evaluation that logged each layer's summed induction and the repeated-sequence losses."""
    record = evaluation(step, best)
    record.update({f"induction_layer{i}": v for i, v in enumerate(layers)})
    record.update(repeat_loss_first=first, repeat_loss_second=second)
    return record


LAB = [
    copying(50, (0.15, 0.16), 5.59, 5.58),
    copying(100, (0.16, 0.40), 5.60, 3.10),  # 0.55 of the first copy's: not yet fallen
    copying(150, (0.18, 0.61), 5.61, 2.80),  # exactly half counts
    copying(200, (0.20, 0.95), 5.60, 0.40, best=0.55),
]


def test_the_losses_and_layer_sums_are_read_and_the_step_each_signal_passed_is_found():
    history = attention_history(LAB)
    assert history[1] == AttentionEval(step=100, final=False, entropy_bits=(5.0, 4.0), induction_best=0.3,
                                       induction_layers=(0.16, 0.40), repeat_loss_first=5.60, repeat_loss_second=3.10)
    assert first_copying(history).step == 150
    assert first_layer_induction(history).step == 150
    assert first_induction(history).step == 200
    assert first_copying(history[:2]) is None and first_layer_induction(history[:2]) is None


def test_the_table_names_when_the_second_copy_loss_fell_and_each_threshold_was_passed():
    table = format_history(attention_history(LAB))
    assert "| 150 | 5.000 | 4.000 | 0.300 | 0.180 | 0.610 | 5.610 | 2.800 |" in table
    assert "second-copy loss fell: step 150 (2.800 nats against 5.610 on the first copy, <= 0.5 of it)" in table
    assert "first induction layer: step 150 (layer 1's heads sum to 0.610 >= 0.6)" in table
    assert table.endswith("first induction head: step 200 (induction_best 0.550 >= 0.5)")
    early = format_history(attention_history(LAB[:2]))
    assert "second-copy loss did not fall: it stayed above 0.5 of the first-copy loss (closest 3.100 against " \
           "5.600, at step 100)" in early
    # The closest is the lowest ratio of the two losses, not the lowest second-copy loss.
    drifting = [copying(50, (0.1, 0.1), 6.0, 5.0), copying(100, (0.1, 0.1), 9.0, 5.5)]
    assert "(closest 5.500 against 9.000, at step 100)" in format_history(attention_history(drifting))
    assert "no induction layer: no layer's heads summed to 0.6 (highest 0.400, at step 100)" in early


def write_metrics(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return run_dir


def test_history_command_prints_the_table_and_draws_the_curves(tmp_path, capsys):
    run_dir = write_metrics(tmp_path / "run", RECORDS)
    out = tmp_path / "history.png"
    assert main(["--run", str(run_dir), "--history", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "first induction head: step 300" in printed.out and "wrote" in printed.err
    assert is_png(out)
    assert main(["--run", str(run_dir), "--history", "--induction-threshold", "0.7"]) == 0
    assert "first induction head: step 400" in capsys.readouterr().out
    assert not (tmp_path / "attention.png").exists()  # no --out, no figure
    lab = write_metrics(tmp_path / "lab", LAB)
    assert main(["--run", str(lab), "--history", "--out", str(tmp_path / "lab.png")]) == 0
    assert "second-copy loss fell: step 150" in capsys.readouterr().out
    assert is_png(tmp_path / "lab.png")


EVALUATED = [{"kind": "eval", "step": 50, "val_loss": 3.0}, {"kind": "final_eval", "step": 100, "val_loss": 2.9}]


TEXT = {"eval": {"attention_stats": True}, "data": {"format": "text"}, "model": {"block_size": 128}}


@pytest.mark.parametrize("config, records, reason", [
    (None, "no-run", "does not exist"),
    (None, None, "has no metrics.jsonl"),
    # A run whose validation split was too small for the probe was told it predated the statistics.
    (TEXT, EVALUATED, "holds no attention statistics: the run's validation split held less than one window of 128 "
     "tokens (model.block_size), too little for the probe; train it again with a larger data.val_fraction or more "
     "data"),
    ({**TEXT, "eval": {"attention_stats": False}}, EVALUATED,
     "holds no attention statistics: the run was trained with eval.attention_stats: false; train it again with it on"),
    ({**TEXT, "data": {"format": "chat"}}, EVALUATED,
     "holds no attention statistics: a chat run's evaluations log none; give a run trained on text"),
    (TEXT, [], "holds no attention statistics: the run has not been evaluated yet"),
    ({"eval": {"interval": 50}, "data": {}, "model": {}}, EVALUATED, "holds no attention statistics: the run predates"),
    (None, EVALUATED, "holds no attention statistics: the run predates them"),
])
def test_a_run_without_statistics_is_told_the_true_reason(tmp_path, config, records, reason):
    run_dir = tmp_path / "run"
    if isinstance(records, list):
        write_metrics(run_dir, [{"kind": "train", "step": 10, "loss": 5.0}, *records])
    elif records is None:
        run_dir.mkdir()
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(UserError) as refused:
        read_attention_history(run_dir)
    assert reason in str(refused.value)


def _without_layer_1(record):
    del record["attn_entropy_layer1"]
    return record


@pytest.mark.parametrize("damaged", [
    lambda r: {**r, "step": "300"},
    lambda r: {**r, "step": True},
    lambda r: {**r, "induction_best": "high"},
    lambda r: {**r, "induction_best": float("nan")},
    lambda r: {**r, "attn_entropy_layer1": None},
    lambda r: {**r, "attn_entropy_layer1": "4.0"},
    _without_layer_1,  # a layer missing
    lambda r: evaluation(200, 0.9, entropy=(5.0,)),  # fewer layers than the others
    lambda r: _without_layer_1(evaluation(200, 0.9, entropy=(5.0, 4.0, 3.0))),  # a gap in the layers
])
def test_an_evaluation_whose_statistics_are_not_numbers_or_miss_a_layer_is_left_out(damaged):
    records = [evaluation(100, 0.2), damaged(evaluation(200, 0.9)), evaluation(300, 0.3)]
    assert [e.step for e in attention_history(records)] == [100, 300]


def test_history_skips_unreadable_evaluations_and_says_so_in_one_line(tmp_path, capsys):
    run_dir = write_metrics(tmp_path / "run", RECORDS + [{**evaluation(500, 0.8), "step": "x"},
                                                         evaluation(600, 0.9, entropy=(1.0,))])
    (run_dir / "metrics.jsonl").open("a").write('{"kind": "eval", "step": 700, "induction_best": []}\n')
    out = tmp_path / "history.png"
    assert main(["--run", str(run_dir), "--history", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: skipped 3 evaluation record(s) of {run_dir / 'metrics.jsonl'} whose attention "
                        "statistics are not numbers or miss a layer"]
    assert "| 400 (final) |" in captured.out and "| 500" not in captured.out and out.is_file()
