"""The RL lab's figure: the RL run's own curves, the chat run it started from at step 0 on the same
questions as each periodic point, and the final pass at the step whose weights it scored."""

import json

import pytest

import benchmarks.rl_lab as rl_lab


@pytest.mark.parametrize("periodic", [True, False])
def test_the_chat_run_starts_the_subset_line_and_the_final_point_sits_at_its_weights_step(tmp_path, monkeypatch,
                                                                                          periodic):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    run = tmp_path / "rl"
    run.mkdir()
    records = [{"kind": "train", "step": s, "loss": 0.01, "reward": 1 + s / 100, "kl": 0.01} for s in range(1, 61)]
    if periodic:
        records += [{"kind": "eval", "step": s, "val_loss": 1 - p, "val_pass@1": p, "val_pass@8": 0.9}
                    for s, p in ((25, 0.37), (50, 0.6))]
    records.append({"kind": "final_eval", "step": 60, "weights_step": 50 if periodic else 60, "val_loss": 0.4,
                    "val_pass@1": 0.6, "val_pass@8": 0.9})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), real_savefig(fig, *a, **k)))
    path = rl_lab.draw_curves(run, {"pass@1": 0.5, "pass@8": 0.88}, {"pass@1": 0.49, "pass@8": 0.9})
    assert path == run / "curves.png" and path.read_bytes()[:4] == b"\x89PNG"
    reward, passes, _ = drawn[0].axes
    assert reward.get_title().startswith("reward") and passes.get_ylim()[1] < 1.1  # their own axes
    lines = {line.get_label(): line for line in passes.get_lines()}
    subset = lines["pass@1 (the evaluation subset)"]
    assert list(subset.get_xdata()) == ([0, 25, 50] if periodic else [0])
    assert list(subset.get_ydata()) == ([0.5, 0.37, 0.6] if periodic else [0.5])
    final = next(line for label, line in lines.items() if label.startswith("pass@1, all held-out questions"))
    assert list(final.get_xdata()) == [50 if periodic else 60]
    before = lines["pass@1 of the chat run, all held-out questions (step 0)"]
    assert (list(before.get_xdata()), list(before.get_ydata())) == ([0], [0.49])
