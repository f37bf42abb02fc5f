"""metrics.jsonl: one JSON object per logged step and per evaluation, appended by training and read
by the loss curve and by ``rundir.record``."""

import json
import os
from pathlib import Path
from typing import Any

from common.errors import UserError, with_path
from common.files import atomic_write_text


class MetricsLog:
    """Appends records to ``metrics.jsonl``: appending rather than rewriting keeps an overnight run
    linear in its length. Each line goes out in one ``write`` on an ``O_APPEND`` descriptor, which a
    killed process cannot leave half-done; a line torn by a power cut is skipped by ``read_metrics``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            while written < len(data):  # only a full disk or a signal gets here
                written += os.write(fd, data[written:])
        except OSError as e:
            raise with_path(e, self.path) from None
        finally:
            os.close(fd)

    def truncate_after(self, step: int) -> None:
        """Keep only records with ``step`` <= ``step`` (the checkpoint a resumed run starts from)."""
        if not self.path.exists():
            return
        if not self.path.is_file():
            raise UserError(f"{self.path} is not a file; move it aside so the run can write its metrics there")
        kept = [r for r in read_metrics(self.path) if isinstance(r.get("step", 0), int) and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file; a damaged line is skipped, not the good ones."""
    records = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
