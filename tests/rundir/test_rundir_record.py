"""What a run records about itself: its config, its parent, the summary of its training, and metrics.jsonl
(appended, truncated on resume and read past damage)."""

import json

import pytest
import yaml

from common.errors import UserError
from rundir.files import METRICS_FILE, PARENT_FILE, RUN_CONFIG_FILE
from rundir.metrics import MetricsLog, read_metrics
from rundir.record import RunRecord, read_config, write_parent_record


def test_the_config_as_written_refused_when_missing_or_damaged_and_the_parent_record(tmp_path):
    with pytest.raises(UserError, match=f"has no {RUN_CONFIG_FILE}"):
        read_config(tmp_path)
    (tmp_path / RUN_CONFIG_FILE).write_text(yaml.safe_dump({"data": {"source": "files"}, "train": {"init_from": "gone"}}))
    assert read_config(tmp_path) == {"data": {"source": "files"}, "train": {"init_from": "gone"}}
    (tmp_path / RUN_CONFIG_FILE).write_text("data: [not, closed")
    with pytest.raises(UserError, match="is damaged .*restore the config"):
        read_config(tmp_path)
    # The parent record names the parent and its model.
    (tmp_path / "parent").mkdir()
    write_parent_record(tmp_path, tmp_path / "parent", {"n_layer": 2})
    record = json.loads((tmp_path / PARENT_FILE).read_text())
    assert record["init_from"] == str((tmp_path / "parent").resolve()) and record["model_config"] == {"n_layer": 2}
    assert "started" in record


def test_run_record_prefers_the_final_validation_and_survives_a_run_that_recorded_nothing(tmp_path):
    (tmp_path / RUN_CONFIG_FILE).write_text(yaml.safe_dump({"data": {"source": "shakespeare", "vocab_size": 320}}))
    log = MetricsLog(tmp_path / METRICS_FILE)
    log.append({"kind": "train", "step": 10, "loss": 3.0, "tokens": 2560})
    log.append({"kind": "eval", "step": 10, "val_bpb": 3.1})
    assert RunRecord.read(tmp_path).val_scope == "validation subset at step 10"
    log.append({"kind": "final_eval", "step": 10, "val_bpb": 2.9})
    log.append({"kind": "eval", "step": 10, "val_bpb": 3.0})
    record = RunRecord.read(tmp_path)
    assert record.data == {"source": "shakespeare", "vocab_size": 320}
    assert (record.val_bpb, record.val_scope) == (2.9, "full validation set at step 10")
    assert (record.steps, record.tokens_per_step) == (10, 256)
    nothing = tmp_path / "nothing"  # a run that recorded nothing, its config damaged
    nothing.mkdir()
    (nothing / RUN_CONFIG_FILE).write_text("data: [not, a, section")
    assert RunRecord.read(nothing) == RunRecord(data={}, val_bpb=None, val_scope=None, steps=None, tokens_per_step=None)
    (nothing / RUN_CONFIG_FILE).write_text(json.dumps({"data": "a string"}))
    assert RunRecord.read(nothing).data == {}


def test_run_record_describes_the_weights_the_run_kept(tmp_path):
    log = MetricsLog(tmp_path / METRICS_FILE)
    for step, loss in ((10, 2.0), (20, 1.5), (30, 1.5), (40, 1.8)):  # overfits after step 20
        log.append({"kind": "eval", "step": step, "val_loss": loss, "val_bpb": loss / 2})
    record = RunRecord.read(tmp_path)
    assert (record.val_bpb, record.val_scope) == (0.75, "validation subset at step 20")
    log.append({"kind": "final_eval", "step": 40, "weights_step": 20, "val_loss": 1.6, "val_bpb": 0.8})
    record = RunRecord.read(tmp_path)
    assert (record.val_bpb, record.val_scope, record.steps) == (0.8, "full validation set at step 20", 40)


def test_metrics_log_appends_reads_truncates_and_reads_past_damage(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(1, 6):
        log.append({"kind": "train", "step": step, "loss": 1.0 / step})
    log.append({"kind": "eval", "step": 5, "val_loss": 0.5})
    with open(log.path, "a") as f:
        f.write('{"kind": "train", "step": 6, "lo')  # torn by a crash
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3, 4, 5, 5]
    log.truncate_after(3)
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3]
    log.append({"kind": "train", "step": 4, "loss": 0.2})
    assert read_metrics(log.path)[-1] == {"kind": "train", "step": 4, "loss": 0.2}
    path = tmp_path / "damaged" / METRICS_FILE  # damaged lines cost only themselves
    path.parent.mkdir()
    path.write_bytes(b'{"step": 1}\n\xff\xfe not utf-8\n[1, 2]\n{"step": 2}\nnot json\n{"step": 3}\n{"step": 4')
    assert read_metrics(path) == [{"step": 1}, {"step": 2}, {"step": 3}]
