"""What train.py shows while it runs and when it ends: progress against the budget that binds,
evaluations that follow the clock, a bar over the final validation, a summary and a loss curve."""

import copy
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from matplotlib.figure import Figure
from matplotlib.image import imread
from tokenizers import trainers

from data.tokenizer import EOT, new_tokenizer, train_tokenizer
from rundir.metrics import MetricsLog, read_metrics
from training import cli as train_cli
from training.loss_curve import write_loss_curve
from training.metrics import CpuShareWatch, Throughput
from training.result import TrainResult
from training.trainer import Trainer


def _run(base_raw: dict, tmp_path: Path, capsys, eval_interval: int = 10, **train) -> tuple[Path, str, str]:
    raw = copy.deepcopy(base_raw)
    raw["train"].update(train)
    # final_max_batches None: the whole split, the pass that needs a bar.
    raw["eval"] = {**raw["eval"], "interval": eval_interval, "final_max_batches": None}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    run_dir = tmp_path / "run"
    assert train_cli.main(["--config", str(config), "--set", f"run.out_dir={run_dir}"]) == 0
    out, err = capsys.readouterr()
    return run_dir, out, err


def _drawn(tmp_path, monkeypatch, records: list[dict], kind: str = "text"):
    """The figure write_loss_curve draws for ``records`` as a ``kind`` run."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for record in records:
        log.append(record)
    drawn = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), real_savefig(fig, *a, **k)))
    write_loss_curve(tmp_path / "metrics.jsonl", tmp_path / "loss_curve.png", kind)
    return drawn[0]


def test_a_clock_bound_run_shows_progress_evaluations_summary_and_curve(base_raw, tmp_path, capsys):
    # The clock binds long before max_steps, and no step reaches eval.interval: as on a slow host.
    run_dir, out, err = _run(base_raw, tmp_path, capsys, eval_interval=50_000, max_steps=100_000, max_minutes=0.04)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert (steps := max(r["step"] for r in records if r["kind"] == "train")) < 100_000
    # The bar ends full, counted in the clock's seconds, not against max_steps.
    last_bar = [line for line in re.split(r"[\r\n]", err) if line.startswith("train:")][-1]
    assert f"| 2/2 s, step {steps} |" in last_bar and "100%" in last_bar, last_bar
    # Evaluations came along the way, every tenth of the clock budget.
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[-1]["step"] == steps  # the last weights are evaluated too, to compete for the kept model
    assert 3 <= len(evals[:-1]) <= 10 and all("elapsed_s" in r for r in evals), evals
    # The final full validation has a progress bar.
    assert re.search(r"full validation: +\d+%\|", err), err[-2000:]
    # The summary: final bits/byte, where the run is, and what to do next.
    final = next(r for r in records if r["kind"] == "final_eval")
    assert f"final validation: {final['val_bpb']:.4f} bits/byte" in out
    assert f"the run is in {run_dir}; its loss curve is {run_dir / 'loss_curve.png'}" in out
    for command in ("python generate.py --run", "--set train.init_from=", "python export.py --run", "python serve.py --run"):
        assert command in out, command
    assert (run_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_step_bound_run_counts_to_max_steps_evaluates_by_steps_and_hints_from_its_own_data(base_raw, tmp_path,
                                                                                             capsys, corpus_file):
    run_dir, out, err = _run(base_raw, tmp_path, capsys, max_steps=12)
    last_bar = [line for line in re.split(r"[\r\n]", err) if line.startswith("train:")][-1]
    assert "| 12/12 " in last_bar, last_bar
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "eval"] == [10, 12]  # every eval.interval steps, and the last
    # The final pass scores weights whose sample was shown at their evaluation: it is not shown again.
    lines = out.splitlines()
    final = next(i for i, line in enumerate(lines) if line.startswith("step 12 full validation"))
    assert not lines[final + 1].startswith("  sample:") and sum(line.startswith("  sample:") for line in lines) == 2
    # The hints sample from the run's own data, not the plays: the corpus's held-out text starts a line with
    # the prompt's words, and the samples continued it.
    hint = [line for line in lines if "python generate.py --run" in line][0]
    prompt = shlex.split(hint.split("#")[0])[-1]
    assert "ROMEO" not in out and any(line.startswith(prompt) for line in corpus_file.read_text().splitlines())
    assert next(r for r in records if r["kind"] == "final_eval")["sample"].startswith(prompt)


def test_no_clock_evaluation_falls_in_the_last_half_interval_of_the_clock():
    # The run's end evaluates the last weights a moment later; with the learning rate at its end they are
    # the same weights, and the two evaluations printed the same numbers and sample twice.
    trainer = Trainer.__new__(Trainer)  # the clock rule alone: a budget of 100 s, an evaluation due every 10 s
    trainer.schedule = SimpleNamespace(max_seconds=100.0)
    trainer.config = SimpleNamespace(eval=SimpleNamespace(interval=5))

    def due(elapsed: float, last: float) -> bool:
        trainer._elapsed, trainer.last_eval_s = (lambda: elapsed), last
        return trainer._clock_eval_due()

    assert due(10.0, 0.0) and not due(9.0, 0.0)
    assert due(94.0, 83.0) and not due(96.0, 85.0)  # 6 s left: due; 4 s left: the end evaluates soon


def test_loss_curve_draws_train_and_validation_against_step_and_time(tmp_path, monkeypatch):
    records = [{"kind": "train", "step": step, "loss": 5.0 / step, "elapsed_s": step * 0.5} for step in range(1, 21)]
    records += [{"kind": "eval", "step": 10, "val_loss": 1.0, "elapsed_s": 5.2},
                {"kind": "final_eval", "step": 20, "val_loss": 0.5}]  # an older record: no time
    _drawn(tmp_path, monkeypatch, records)
    assert imread(tmp_path / "loss_curve.png").shape[:2] == (420, 1100)


def _result(**fields) -> TrainResult:
    return TrainResult(**{"run_dir": Path("runs/tiny"), "step": 136, "tokens_seen": 100, "stopped_by": "max_steps",
                          "train_seconds": 600.0, "val_loss": 1.0, "val_bpb": 2.75, **fields})


STARVED = dict(stopped_by="max_minutes", starved_share=0.3)
CHAT = dict(run_dir=Path("runs/tiny-chat"), kind="chat", val_words="1.5000 bits/byte of assistant text",
            wandb_sync="wandb sync runs/tiny-chat/wandb/offline-run-*-abc*")
KEPT = dict(step=400, kept_step=180, kept_score="1.4190 nats/token", last_score="1.6080 nats/token")
SLOW = ("train.max_minutes ended it after 136 steps", "on a CPU 30% of the time")
LLAMA = ("python export.py --run runs/tiny --out exports/tiny-llama --format llama",
         "python export.py --run runs/tiny --out exports/tiny-gguf --format gguf")


# Each row: the result, summary()'s options, what its text must say and what it must not.
@pytest.mark.parametrize("fields, options, said, unsaid", [
    (STARVED, {}, SLOW, ()),  # the clock ended a starved run early: say so, and why
    ({"starved_share": 0.3}, {}, (), SLOW),  # a step budget is not shortened by a slow machine
    ({"stopped_by": "max_minutes"}, {}, (), SLOW),  # a run that got its cores
    ({**STARVED, "threads": 2}, {}, ("on a quieter machine", "--threads 1"), ()),
    ({**STARVED, "threads": 1}, {}, ("on a quieter machine",), ("--threads 1",)),
    (KEPT, {}, ("kept: the weights of step 180, the best validation loss seen (1.4190 nats/token on the evaluation "
                "subset, against 1.6080 nats/token at the last step); the last state (step 400) stays in "
                "trainer_state.pt for --resume",), ()),
    ({**KEPT, "kept_step": 400, "kept_score": "1.3000 nats/token"}, {},
     ("kept: the last weights (step 400), the best validation loss seen (1.3000",), ()),
    ({**KEPT, "kind": "rl", "kept_by": "held-out pass@1", "kept_score": "0.410", "last_score": "0.380"}, {},
     ("kept: the weights of step 180, the best held-out pass@1 seen (0.410 on the evaluation subset, against "
      "0.380 at the last step)",), ()),
    ({"step": 400, "kept_step": 400}, {}, ("kept: the last weights (step 400; no periodic evaluation",), ()),
    (CHAT, {}, ("final validation: 1.5000 bits/byte of assistant text", "python generate.py --run runs/tiny-chat --chat",
                "python -m benchmarks.chat_eval --runs runs/tiny-chat"), ("init_from", "--tools")),
    # A run that learned to call tools is talked to with them: without, its calls print as raw text.
    (CHAT, {"tools": ("calculator",)}, ("generate.py --run runs/tiny-chat --chat --tools calculator   #",), ()),
    ({}, {"chat_tuning": True}, ("configs/tiny-chat.yaml",), ()),
    ({}, {"chat_tuning": False}, (), ("configs/tiny-chat.yaml",)),
    ({}, {"llama_shaped": True}, LLAMA, ()),
    ({}, {"llama_shaped": False}, (), ("--format llama", "--format gguf")),
])
def test_the_summary(fields, options, said, unsaid):
    text = train_cli.summary(_result(**fields), None, **options)
    assert all(part in text for part in said) and not any(part in text for part in unsaid), text
    if "wandb_sync" in fields:
        assert text.splitlines()[-1] == ("wandb logged offline; upload it with: "
                                         "wandb sync runs/tiny-chat/wandb/offline-run-*-abc*")


def test_the_tools_a_run_learned():
    calls = SimpleNamespace(data=SimpleNamespace(source="calculator"), rl=None)
    grpo = SimpleNamespace(data=SimpleNamespace(source="shakespeare"), rl=SimpleNamespace(tools=["calculator", "my:f"]))
    plain = SimpleNamespace(data=SimpleNamespace(source="shakespeare"), rl=SimpleNamespace(tools=[]))
    assert [train_cli.tools_learned(c) for c in (calls, grpo, plain)] == [("calculator",), ("calculator", "my:f"), ()]


def test_a_run_starved_of_cpu_time_says_so_once():
    def watched(cpu_per_wall: float, device: str = "cpu"):
        throughput = Throughput(window=4)
        for _ in range(4):
            throughput.add(100, 1.0, cpu_per_wall)
        watch = CpuShareWatch(torch.device(device), threads=2)
        said = [watch.advice(throughput), watch.advice(throughput)]  # once is enough
        return watch, [line for line in said if line is not None]

    starved, said = watched(0.2)
    assert starved.starved_share == pytest.approx(0.2)
    assert len(said) == 1 and "20% of the time" in said[0] and "--threads 1" in said[0]
    busy, said = watched(0.97)
    assert busy.starved_share is None and said == []
    on_a_gpu, said = watched(0.2, "meta")  # only a CPU's share is watched
    assert on_a_gpu.starved_share is None and said == []


def test_loss_curve_is_in_bits_per_byte_with_nats_per_token_beside(tmp_path, monkeypatch):
    records = [{"kind": "train", "step": step, "loss": 4.0 / step, "elapsed_s": step} for step in (1, 2)]
    # 2 nats/token at 3 bytes/token is 2 / (3 ln 2) bits/byte.
    records.append({"kind": "final_eval", "step": 2, "val_loss": 2.0, "val_bpb": 0.9618, "elapsed_s": 2.5})
    by_step = _drawn(tmp_path, monkeypatch, records).axes[0]
    assert by_step.get_ylabel() == "bits per byte"
    train_line, validation = by_step.get_lines()
    assert list(train_line.get_ydata()) == pytest.approx([4.0 * 0.9618 / 2.0, 2.0 * 0.9618 / 2.0], abs=1e-9)
    assert list(validation.get_ydata()) == [0.9618]
    assert [ax.get_ylabel() for ax in by_step.child_axes] == ["loss (nats/token)"]


def test_a_resumed_run_says_what_each_duration_covers():
    line = train_cli.done_line(_result(step=20, tokens_seen=40_960, train_seconds=48.0, earlier_seconds=30.0,
                                       epochs=2.5), session_seconds=30.0)
    assert ("40,960 tokens (2.5 epochs of the training split), 0.3 min of training in this session "
            "(0.8 min over the whole run), 0.5 min in all this session;") in line
    fresh = train_cli.done_line(_result(step=20, tokens_seen=40_960, train_seconds=18.0), session_seconds=30.0)
    assert "40,960 tokens, 0.3 min of training, 0.5 min in all;" in fresh


def test_chat_tuning_and_the_llama_exports_are_suggested_only_where_they_fit(make_config, tmp_path):
    config = make_config()
    run = config.out_dir
    run.mkdir(parents=True)
    assert not train_cli.suits_chat_tuning(config)  # no tokenizer to read
    train_tokenizer(["some natural text to learn from"] * 20, 300).save(str(run / "tokenizer.json"))
    assert train_cli.suits_chat_tuning(config)
    assert not train_cli.suits_chat_tuning(make_config(data={"source": "synthetic"}))
    # A tokenizer from before the chat tokens were reserved: tiny-chat.yaml could not render its data.
    old = new_tokenizer()
    old.train_from_iterator(["some natural text"] * 20, trainers.BpeTrainer(vocab_size=280, special_tokens=[EOT]))
    old.save(str(run / "tokenizer.json"))
    assert not train_cli.suits_chat_tuning(config)
    # learned positions block the llama and gguf exports
    assert not make_config(model={"positions": "rope"}).model.llama_blockers() and config.model.llama_blockers()


def test_loss_curve_draws_the_final_full_validation_as_its_own_point_at_the_kept_step(tmp_path, monkeypatch):
    records = [{"kind": "train", "step": step, "loss": 3.0 / step, "elapsed_s": step} for step in range(1, 31)]
    subset = {10: 2.0, 20: 1.5, 30: 1.8}  # the run overfits after step 20, which it keeps
    records += [{"kind": "eval", "step": step, "val_loss": loss, "val_bpb": loss / 2, "elapsed_s": step + 0.5}
                for step, loss in subset.items()]
    records.append({"kind": "final_eval", "step": 30, "weights_step": 20, "val_loss": 1.6, "val_bpb": 0.8,
                    "elapsed_s": 40.0})
    by_step, by_time = _drawn(tmp_path, monkeypatch, records).axes[:2]
    for axes, x in ((by_step, [20]), (by_time, [20.5 / 60])):
        _, periodic, final = axes.get_lines()
        # The subset's line holds the periodic evaluations alone; the full pass is a marked point
        # of its own, where its weights come from, with its own legend entry.
        assert list(periodic.get_ydata()) == [1.0, 0.75, 0.9] and list(final.get_ydata()) == [0.8]
        assert list(final.get_xdata()) == pytest.approx(x) and final.get_linestyle() == "None"
        assert [t.get_text() for t in axes.get_legend().get_texts()][1:] == [
            "validation (the evaluation subset)", "full validation (weights of step 20)"]


def test_a_dpo_run_draws_its_loss_accuracies_and_margins(tmp_path, monkeypatch):
    records = [{"kind": "train", "step": s, "loss": 0.7 / s, "rewards/accuracies": 1 - 1 / s, "rewards/margins": s / 2,
                "elapsed_s": s} for s in range(1, 11)]
    records += [{"kind": "eval", "step": s, "val_loss": 0.5 / s, "val_bpb": 2.0, "val_rewards/accuracies": 0.8,
                 "val_rewards/margins": s / 3, "elapsed_s": s} for s in (5, 10)]
    records.append({"kind": "final_eval", "step": 10, "weights_step": 10, "val_loss": 0.06, "val_bpb": 2.0,
                    "val_rewards/accuracies": 0.75, "val_rewards/margins": 3.0})
    figure = _drawn(tmp_path, monkeypatch, records, "preference")
    loss, accuracies, margins = figure.axes
    assert [a.get_title() for a in figure.axes] == ["DPO loss", "rewards/accuracies", "rewards/margins"]
    assert all(a.get_xlabel() == "step" and "bits" not in a.get_ylabel() for a in figure.axes)
    train_line, held_out, final = accuracies.get_lines()
    assert list(train_line.get_ydata()) == pytest.approx([1 - 1 / s for s in range(1, 11)])
    assert list(held_out.get_ydata()) == [0.8, 0.8] and list(final.get_ydata()) == [0.75]
    assert list(loss.get_lines()[0].get_ydata()) == pytest.approx([0.7 / s for s in range(1, 11)])  # not in bits
    assert accuracies.get_ylim()[0] < 0 < 1 < accuracies.get_ylim()[1]


def test_an_rl_run_draws_reward_and_pass_at_k_on_axes_of_their_own(tmp_path, monkeypatch):
    records = [{"kind": "train", "step": s, "loss": 0.01, "reward": 0.2 * s, "kl": 0.001 * s} for s in range(1, 9)]
    records += [{"kind": "eval", "step": s, "val_loss": 1 - p, "val_pass@1": p, "val_pass@8": min(1, 3 * p)}
                for s, p in ((4, 0.2), (8, 0.1))]
    # The kept weights are step 4's: the final pass is drawn there, not at the last step.
    records.append({"kind": "final_eval", "step": 8, "weights_step": 4, "val_loss": 0.75, "val_pass@1": 0.25,
                    "val_pass@8": 0.5})
    figure = _drawn(tmp_path, monkeypatch, records, "rl")
    reward, passes, kl = figure.axes
    assert reward.get_title().startswith("reward") and reward.get_ylabel() and passes.get_ylabel()
    assert [line.get_ydata()[-1] for line in reward.get_lines()] == [pytest.approx(1.6)]  # a reward of 0 to 2 ...
    assert passes.get_ylim()[1] < 1.1  # ... is not on pass@1's axis, a share
    subset1, final1, subset8, final8 = passes.get_lines()
    assert list(subset1.get_ydata()) == [0.2, 0.1] and list(final1.get_xdata()) == [4]
    assert list(final1.get_ydata()) == [0.25] and list(final8.get_ydata()) == [0.5]
    assert kl.get_title() == "KL to the reference"
    assert all("nats/token" not in a.get_ylabel() for a in (reward, passes))
