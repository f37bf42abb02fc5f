"""metrics.jsonl appended, truncated on resume and read past damage."""

from rundir.files import METRICS_FILE
from rundir.metrics import MetricsLog, read_metrics


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
