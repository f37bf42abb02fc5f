"""metrics.jsonl appended, truncated on resume and read past damage, and what a run recorded."""

from __future__ import annotations

import json

import yaml

from rundir.files import CONFIG_FILE, METRICS_FILE
from rundir.metrics import MetricsLog, RunRecord, read_metrics


def test_metrics_log_appends_reads_and_truncates(tmp_path):
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


def test_damaged_lines_cost_only_themselves(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_bytes(b'{"step": 1}\n\xff\xfe not utf-8\n[1, 2]\n{"step": 2}\nnot json\n{"step": 3}\n{"step": 4')
    assert read_metrics(path) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_run_record_prefers_the_final_validation(tmp_path):
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump({"data": {"source": "shakespeare", "vocab_size": 320}}))
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


def test_run_record_of_a_run_that_recorded_nothing(tmp_path):
    (tmp_path / CONFIG_FILE).write_text("data: [not, a, section")  # damaged YAML
    assert RunRecord.read(tmp_path) == RunRecord(data={}, val_bpb=None, val_scope=None, steps=None, tokens_per_step=None)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"data": "a string"}))
    assert RunRecord.read(tmp_path).data == {}
