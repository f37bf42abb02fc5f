"""GRPO under torchrun (e2e): the run equals the one-process run (each completion seeded by its
question's place), with the calculator too, and a reward failing on one process stops both in one line."""

import json
import os
from pathlib import Path

import pytest
import torch

from rundir.checkpoint import load_trainer_state
from rundir.files import METRICS_FILE
from rundir.metrics import read_metrics
from launch_testkit import every_rank_says_one_line, launch, ok, torchrun_env, train_args

# What the runs log per step and evaluation that must agree (sums in another order: to rounding).
# The weights agree to rounding too, but an absolute 1e-5: Adam divides each gradient by its own running
# scale, so an element whose gradient is near zero still moves by up to the learning rate, and the
# rounding of a sum taken in another order reaches it undivided.
WEIGHTS_ATOL = 1e-5
COMPARED = ("loss", "reward", "reward_std", "rewards/grader:e_share/mean", "rewards/grader:e_share/std", "kl",
            "completions/mean_length", "completions/clipped_ratio", "val_pass@1", "val_pass@2", "tools/calling_ratio",
            "tools/parsed_ratio", "tools/call_frequency", "val_tools/calling_ratio", "val_tools/parsed_ratio")

# An untrained model's replies already differ on the share of their letters that are e, so its
# groups have advantages to learn from (none of its replies is a right sum yet); and a reward that
# only rank 1 cannot compute.
GRADER = """import os


def e_share(prompt, completion, row):
    return completion.count("e") / max(len(completion), 1)


def fails_on_rank_1(prompt, completion, row):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1 cannot grade")
    return 0.0
"""

@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """torchrun's environment, with the rewards' module importable."""
    folder = tmp_path_factory.mktemp("rewards")
    (folder / "grader.py").write_text(GRADER, encoding="utf-8")
    base = torchrun_env()
    return {**base, "PYTHONPATH": f"{base['PYTHONPATH']}{os.pathsep}{folder}"}


@pytest.fixture(scope="module")
def parent(small_overrides, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("rl-parent") / "parent"
    ok(launch(1, train_args(small_overrides, run, "model.block_size=64", "train.max_steps=2", "eval.interval=0",
                            "eval.sample_tokens=0")))
    return run


def _rl_args(parent: Path, out: Path, *more: str) -> list[str]:
    sets = [f"train.init_from={json.dumps(str(parent))}", f"run.out_dir={json.dumps(str(out))}", "train.max_steps=3",
            "train.max_minutes=null", "train.device=cpu", "train.precision=fp32", "train.peak_flops=1e11",
            "train.lr=1e-2", "train.min_lr=1e-2", "eval.interval=2", "eval.max_batches=1", "eval.final_max_batches=2",
            "eval.sample_tokens=4", "logging.interval=1", "logging.wandb.mode=disabled", "run.checkpoint_interval=0",
            "rl.group_size=4", "rl.max_new_tokens=3", "rl.rewards=[grader:e_share]", "rl.eval_samples=2",
            "rl.updates_per_batch=2", "rl.beta=0.1",
            "rl.arithmetic.train_problems=40", "rl.arithmetic.val_problems=8", "rl.arithmetic.max_operand=9", *more]
    return ["train.py", "--config", "configs/tiny-rl.yaml", "--no-progress", *[a for s in sets for a in ("--set", s)]]


def _records(run: Path) -> list[tuple[str, int, dict[str, float]]]:
    return [(r["kind"], r["step"], {k: r[k] for k in COMPARED if k in r}) for r in read_metrics(run / METRICS_FILE)]


def _assert_same_runs(one: Path, two: Path) -> list[tuple[str, int, dict[str, float]]]:
    """The one-process run and the two-process run logged the same metrics at the same steps and ended on
    the same weights (to WEIGHTS_ATOL); the one-process run's records, for the caller's own checks."""
    alone, shared = _records(one), _records(two)
    assert [(k, s) for k, s, _ in shared] == [(k, s) for k, s, _ in alone]
    for (kind, step, want), (_, _, got) in zip(alone, shared):
        assert got.keys() == want.keys(), (kind, step)
        for name, value in want.items():
            assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-6), (kind, step, name)
    a, b = load_trainer_state(one)["model"], load_trainer_state(two)["model"]
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-4, atol=WEIGHTS_ATOL, msg=name)
    return alone


# The calculator in the loop, from the tiny run that calls it (tests/run_testkit.py), on two-digit problems.
TOOLS = ("rl.task=calculator rl.tools=[calculator] rl.max_tool_calls=2 rl.max_new_tokens=40 eval.sample_tokens=40 "
         "rl.calculator.train_problems=40 rl.calculator.val_problems=8 rl.calculator.digits=2 "
         "rl.calculator.operations=+-* train.lr=1e-3 train.min_lr=1e-3")


@pytest.mark.e2e
@pytest.mark.distributed
@pytest.mark.parametrize("parent_run, batch", [
    ("parent", "train.batch_size=4 train.grad_accum_steps=2"), ("parent", "train.batch_size=4"),
    ("tool_run_dir", f"train.batch_size=4 {TOOLS}")],
    ids=["micro-batches-become-processes", "a-batch-split-between-processes", "with-the-calculator"])
def test_rl_on_two_processes_equals_one_process(request, env, tmp_path, parent_run, batch):
    one, two, parent = tmp_path / "one", tmp_path / "two", request.getfixturevalue(parent_run)
    ok(launch(1, _rl_args(parent, one, *batch.split()), 300, env))
    ok(launch(2, _rl_args(parent, two, *batch.split()), 300, env))
    assert load_trainer_state(two)["world_size"] == 2

    alone = _assert_same_runs(one, two)
    assert any(values.get("reward_std") for _, _, values in alone)  # the groups' rewards differ: the runs learn
    if "rl.tools" in batch:  # the model calls
        assert all(values["tools/calling_ratio"] > 0 for kind, _, values in alone if kind == "train")


@pytest.mark.e2e
@pytest.mark.distributed
def test_a_reward_that_fails_on_one_process_stops_both_with_one_line(parent, env, tmp_path):
    proc = launch(2, _rl_args(parent, tmp_path / "run", "rl.rewards=[grader:fails_on_rank_1]", "train.batch_size=4"),
                  300, env)
    line = every_rank_says_one_line(proc)
    assert line.startswith("error: stopped at step 1: reward 'grader:fails_on_rank_1' raised RuntimeError: rank 1 "
                           "cannot grade for the question 'What is ")
    assert "no checkpoint had been written yet" in line
