"""A user's reward function (``rl.rewards: [module:function]``) that misbehaves: refused when the config is
read where that can be known, else stopped at the step where it fails, in one line naming the reward, what
it returned or raised and the question, exit 2 and the last checkpoint untouched; Ctrl-C still interrupts."""

import itertools
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import train as train_cli
from common.config import ConfigError
from rundir.checkpoint import load_trainer_state
from training.config import save_config
from training.tasks.grpo.rewards import MAX_REWARD, Reward, RewardError, reward_function

_names = itertools.count()


def _module(tmp_path: Path, monkeypatch, source: str) -> str:
    """A module of ``source`` importable under a fresh name (imports are cached by name)."""
    name = f"hostile_reward_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# Refused when the config is read


@pytest.mark.parametrize("source, attribute, fragment", [
    ("def reward(prompt, completion, row:\n    return 1.0\n", "reward", "importing {module} failed: "),
    ("raise RuntimeError('no database here')\n", "reward", "importing {module} raised RuntimeError: no database here"),
    ("import sys\nsys.exit(3)\n", "reward", "importing {module} called sys.exit(3)"),
    ("import no_such_package_anywhere\n", "reward", "there is no module 'no_such_package_anywhere'"),
    ("def reward(prompt, completion, row):\n    return 1.0\n", "rewrd", "{module} has no function 'rewrd'"),
    ("reward = 3\n", "reward", "{module} has no function 'reward'"),
    ("def reward(prompt, completion):\n    return 1.0\n", "reward", "cannot be called as (prompt, completion, row)"),
    ("def reward(prompt, completion, row, scale):\n    return 1.0\n", "reward",
     "cannot be called as (prompt, completion, row)"),
    ("class reward:\n    pass\n", "reward", "cannot be called as (prompt, completion, row)"),
    (None, "short", "there is no module '{module}'; put {module}.py beside train.py"),
], ids=["syntax-error", "raises-at-import", "exits-at-import", "imports-a-missing-module", "no-such-function",
        "not-a-function", "two-arguments", "four-arguments", "a-class", "no-such-module"])
def test_a_reward_that_cannot_work_is_refused_when_the_config_is_read(tmp_path, monkeypatch, source, attribute,
                                                                       fragment):
    module = _module(tmp_path, monkeypatch, source) if source is not None else "my_rewardz"
    with pytest.raises(RewardError) as error:
        reward_function(f"{module}:{attribute}")
    message = str(error.value)
    assert "\n" not in message and f"reward '{module}:{attribute}'" in message, message
    assert fragment.format(module=module) in message, message


def test_keyboard_interrupt_while_importing_or_inside_a_reward_is_not_swallowed(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        reward_function(f"{module}:reward")
    with pytest.raises(KeyboardInterrupt):
        Reward("mine", _interrupted)("q", "c", {})


# Each score is checked when the reward is called


def _exits(prompt, completion, row):
    raise SystemExit(3)


def _interrupted(prompt, completion, row):
    raise KeyboardInterrupt


class _Tensorish:  # a one-value tensor-like object, as numpy and torch scalars are: float() reads it
    def __float__(self) -> float:
        return 0.25


PAST_MAX = math.nextafter(MAX_REWARD, math.inf)  # one float64 step past the bound


@pytest.mark.parametrize("returns, shown", [
    (None, "returned None"), ("1.0", "returned '1.0'"), (np.str_("1.0"), "returned np.str_('1.0')"),
    ([1.0], "returned [1.0]"), ({"score": 1}, "returned {'score': 1}"),
    (float("nan"), "returned nan"), (float("inf"), "returned inf"), (float("-inf"), "returned -inf"),
    (1e300, "returned 1e+300"), (PAST_MAX, f"returned {PAST_MAX!r}"), (-PAST_MAX, f"returned {-PAST_MAX!r}"),
    (10**400, "returned 1000000000"), (complex(1, 1), "returned (1+1j)"),
    (torch.tensor([1.0, 2.0]), "returned tensor([1., 2.])"),
])
def test_a_score_that_is_no_finite_number_in_bounds_is_refused_naming_the_reward_and_question(returns, shown):
    reward = Reward("mine:score", lambda prompt, completion, row: returns)
    with pytest.raises(RewardError) as error:
        reward("What is 3+4?", "7", {"answer": "7"})
    message = str(error.value)
    assert "\n" not in message and message.startswith("reward 'mine:score' " + shown)
    assert "for the question 'What is 3+4?' (reply '7')" in message and "finite number from -1e+06 to 1e+06" in message


@pytest.mark.parametrize("function, fragment", [
    (lambda prompt, completion, row: 1 / 0, "raised ZeroDivisionError: division by zero"),
    (lambda prompt, completion, row: row["solution"], "raised KeyError: 'solution'"),
    (lambda prompt, completion, row: int(completion), "raised ValueError: invalid literal for int()"),
    (_exits, "called sys.exit(3)"),
], ids=["divides-by-zero", "reads-a-missing-key", "parses-a-non-number", "calls-sys-exit"])
def test_a_reward_that_raises_is_one_line_naming_it_and_the_question(function, fragment):
    reward = Reward("mine:score", function)
    with pytest.raises(RewardError) as error:
        reward("What is 3+4?", "seven\nor eight", {"answer": "7"})
    message = str(error.value)
    assert "\n" not in message and fragment in message and "reply 'seven\\nor eight'" in message


@pytest.mark.parametrize("value, expected", [
    (True, 1.0), (2, 2.0), (np.float32(0.5), 0.5), (torch.tensor(0.75), 0.75), (_Tensorish(), 0.25),
    (MAX_REWARD, MAX_REWARD), (-MAX_REWARD, -MAX_REWARD),  # the bounds themselves
])
def test_numbers_of_every_kind_are_scores(value, expected):
    assert Reward("mine", lambda p, c, r: value)("q", "c", {}) == expected


# A run whose reward fails only at its second step


# Good for the first step's 2 x 2 questions x 3 completions, then the failure.
FAILS_LATER = """
calls = 0

def score(prompt, completion, row):
    global calls
    calls += 1
    if calls <= 12:
        return 0.5 if "e" in completion else 0.0
    {failure}
"""


def _rl_run_config(make_config, parent_run: Path, out_dir: Path, reward: str, tmp_path: Path) -> Path:
    config = make_config(
        out_dir, model={}, data={"format": "rl"},
        train={"init_from": str(parent_run), "max_steps": 3, "batch_size": 2, "grad_accum_steps": 2,
               "warmup_steps": 0},
        eval={"interval": 0, "sample_tokens": 0, "final_max_batches": 1},
        run={"checkpoint_interval": 1},
        rl={"group_size": 3, "max_new_tokens": 3, "rewards": [reward], "eval_samples": 2,
            "arithmetic": {"train_problems": 40, "val_problems": 4, "max_operand": 9}},
    )
    path = tmp_path / "rl.yaml"
    save_config(config, path)
    return path


@pytest.mark.parametrize("failure, code, said", [
    ("return None", 2, "reward '{module}:score' returned None for the question 'What is "),
    ("return float('nan')", 2, "reward '{module}:score' returned nan for the question 'What is "),
    ("raise RuntimeError('the grader is down')", 2,
     "reward '{module}:score' raised RuntimeError: the grader is down for the question 'What is "),
    ("import sys; sys.exit(3)", 2, "reward '{module}:score' called sys.exit(3) for the question 'What is "),
    ("raise KeyboardInterrupt", 130, "interrupted; the last saved checkpoint (if any) is intact"),  # as anywhere else
])
def test_a_reward_that_fails_at_step_two_stops_the_run_there_with_the_checkpoint_untouched(
        make_config, parent_run, tmp_path, monkeypatch, capsys, failure, code, said):
    module = _module(tmp_path, monkeypatch, FAILS_LATER.format(failure=failure))
    out = tmp_path / "run"
    config_file = _rl_run_config(make_config, parent_run, out, f"{module}:score", tmp_path)
    assert train_cli.main(["--config", str(config_file), "--no-progress"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert said.format(module=module) in err[-1]
    if code == 2:  # one line, at the step that failed
        assert len(err) == 1 and err[0].startswith("error: stopped at step 2: reward ")
        assert f"the last good checkpoint (step 1) in {out} is untouched" in err[0]
    assert load_trainer_state(out)["step"] == 1


def test_a_reward_refused_by_the_config_is_refused_before_any_work(make_config, parent_run, tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "def score(prompt):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=rf"rl.rewards: reward '{module}:score': score\(prompt\) cannot be called"):
        make_config(tmp_path / "run", data={"format": "rl"}, train={"init_from": str(parent_run)},
                    rl={"rewards": [f"{module}:score"]})
    assert not (tmp_path / "run").exists()
