"""The induction lab as a user runs it: train.py on configs/induction.yaml, then attention.py."""

import re
from pathlib import Path

import pytest

from e2e_testkit import ROOT, run_command


@pytest.mark.e2e
def test_the_lab_shows_the_phase_change_and_the_probe_sees_the_head(tmp_path: Path) -> None:
    run = tmp_path / "induction"
    trained = run_command([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "induction.yaml"),
                           "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", f"run.out_dir={run}",
                           "--set", "logging.wandb.mode=disabled", "--set", "train.peak_flops=1e11",
                           "--no-progress"], cwd=tmp_path, timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]

    history = run_command([str(ROOT / "attention.py"), "--run", str(run), "--history", "--out",
                           str(tmp_path / "history.png")], cwd=tmp_path)
    assert history.returncode == 0, history.stderr[-3000:]
    fell = re.search(r"second-copy loss fell: step (\d+) \(([\d.]+) nats against ([\d.]+)", history.stdout)
    assert fell, history.stdout[-2000:]
    assert int(fell.group(1)) < 800 and float(fell.group(2)) <= 0.5 * float(fell.group(3))
    assert "first induction layer: step" in history.stdout
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    roles = run_command([str(ROOT / "attention.py"), "--run", str(run), "--roles"], cwd=tmp_path)
    assert roles.returncode == 0, roles.stderr[-3000:]
    layer_sums = [float(total) for total in re.findall(r"^\| [01] \| ([\d.]+) \|$", roles.stdout, re.M)]
    assert len(layer_sums) == 2 and layer_sums[1] >= 0.6, roles.stdout[-2000:]
