"""GRPO: the loss's gradient against the analytic policy gradient on a one-token task, its clip at its
bounds, the rollout's metrics by value, and an RL run from a trained parent, with the calculator in the loop
too, that logs TRL's metric names, evaluates pass@k and resumes exactly. (The token mean over a ragged step:
test_grpo_tools.)
A user's reward function (``rl.rewards: [module:function]``) that misbehaves: refused when the config is
read where that can be known, else stopped at the step where it fails, in one line naming the reward, what
it returned or raised and the question, exit 2 and the last checkpoint untouched; Ctrl-C still interrupts."""

import itertools
import math
import textwrap
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import training.cli as train_cli
from chat_testkit import pretrain
from common.config import ConfigError, merged
from common.errors import UserError
from rundir.checkpoint import load_trainer_state, save_checkpoint
from rundir.metrics import read_metrics
from training.config import config_from_dict, load_run_config, save_config
from training.tasks.grpo.loss import group_advantages, target_logps, token_losses
from training.tasks.grpo.rewards import (MAX_REWARD, Reward, RewardError, closeness, correct, integer_format,
                                         reward_function)
from training.tasks.grpo.rollout import rollout_metrics
from training.trainer import train

VOCAB = 7


def _one_token_loss(theta, actions, advantages, old, ref, *, epsilon, beta, temperature):
    """The token-mean loss of a group of one-token completions drawn from logits ``theta``."""
    logits = theta.expand(len(actions), 1, VOCAB)
    y = actions[:, None]
    logps = target_logps(logits, y, temperature)
    losses, _, _, _ = token_losses(logps, old[:, None], ref[:, None], advantages, epsilon=epsilon, beta=beta)
    return losses.sum() / len(actions)


def _analytic_gradient(theta, actions, advantages, old, ref, *, epsilon, beta, temperature):
    """d loss / d theta written out: for action a, d log π(a) / d theta = (e_a − π) / T; the clipped
    surrogate contributes −A·ratio where the clip is not active, the k3 KL β·(1 − π_ref(a) / π(a))."""
    p = torch.softmax(theta.double() / temperature, dim=-1)
    logp = torch.log(p)
    gradient = torch.zeros(VOCAB, dtype=torch.float64)
    for a, adv, o, r in zip(actions.tolist(), advantages.double().tolist(), old.double().tolist(),
                            ref.double().tolist()):
        ratio = torch.exp(logp[a] - o)
        clipped = (ratio > 1 + epsilon and adv > 0) or (ratio < 1 - epsilon and adv < 0)
        coefficient = (0.0 if clipped else -adv * ratio) + beta * (1 - torch.exp(r - logp[a]))
        gradient += coefficient * (torch.eye(VOCAB, dtype=torch.float64)[a] - p) / temperature
    return gradient / len(actions)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("off_policy", [False, True])
def test_the_gradient_is_the_analytic_policy_gradient_with_the_kl_penalty(temperature, off_policy):
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(VOCAB, generator=g, requires_grad=True)
    ref_theta = torch.randn(VOCAB, generator=g)
    actions = torch.multinomial(torch.softmax(theta.detach() / temperature, -1), 8, replacement=True, generator=g)
    rewards = (actions % 2 == 0).float() + 0.1 * actions.float()
    advantages, _ = group_advantages(rewards, group_size=8)
    ref = torch.log_softmax(ref_theta / temperature, -1)[actions]
    own = torch.log_softmax(theta.detach() / temperature, -1)[actions]
    # Off-policy: the sampling policy differs, so some ratios leave [1 - ε, 1 + ε] and are clipped.
    old = own + (torch.randn(8, generator=g) * 0.5 if off_policy else 0)
    options = dict(epsilon=0.2, beta=0.3, temperature=temperature)

    _one_token_loss(theta, actions, advantages, old, ref, **options).backward()
    expected = _analytic_gradient(theta.detach(), actions, advantages, old, ref, **options)
    torch.testing.assert_close(theta.grad.double(), expected, rtol=1e-5, atol=1e-6)
    ratios = torch.exp(own - old)
    if off_policy:  # the case tests the clip: some tokens are clipped, some not
        clipped = ((ratios > 1.2) & (advantages > 0)) | ((ratios < 0.8) & (advantages < 0))
        assert 0 < clipped.sum() < 8

    # The test tells a wrong sign from a right one, in either term.
    flipped_advantage = _analytic_gradient(theta.detach(), actions, -advantages, old, ref, **options)
    flipped_kl = _analytic_gradient(theta.detach(), actions, advantages, old, ref, **{**options, "beta": -0.3})
    for wrong in (flipped_advantage, flipped_kl):
        assert not torch.allclose(theta.grad.double(), wrong, rtol=1e-3, atol=1e-4)


def test_a_step_raises_the_probability_of_the_better_completion():
    # Two completions of one prompt, one rewarded: a small step of gradient descent makes it likelier.
    theta = torch.zeros(VOCAB, requires_grad=True)
    actions = torch.tensor([2, 5])
    advantages, _ = group_advantages(torch.tensor([1.0, 0.0]), group_size=2)
    own = torch.log_softmax(theta.detach(), -1)[actions]
    _one_token_loss(theta, actions, advantages, own, own, epsilon=0.2, beta=0.1, temperature=1.0).backward()
    stepped = torch.softmax(theta.detach() - 0.5 * theta.grad, -1)
    assert stepped[2] > 1 / VOCAB > stepped[5]


def test_advantages_and_every_rollout_metric_have_their_values_on_a_hand_made_batch():
    # Two groups of three, two reward functions: the first group's summed rewards 0, 1, 2 (deviation
    # 1), the second's all 3 (deviation 0). reward_std is the mean of the groups' deviations (TRL's),
    # 0.5, not the batch's (1.26); a reward function's std is its column's, Bessel-corrected.
    scores = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    lengths = torch.tensor([6.0, 2.0, 12.0, 4.0, 10.0, 8.0])
    ended = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    assert rollout_metrics(scores, lengths, ended, ["a", "b"], group_size=3) == pytest.approx({
        "reward": 2.0, "reward_std": 0.5, "frac_reward_zero_std": 0.5,
        "rewards/a/mean": 1.0, "rewards/b/mean": 1.0, "rewards/a/std": 0.4 ** 0.5, "rewards/b/std": 1.2 ** 0.5,
        "completions/mean_length": 7.0, "completions/min_length": 2.0, "completions/max_length": 12.0,
        "completions/clipped_ratio": 1 / 3,
    }, rel=1e-6)
    # Each reward against its group's, over the group's deviation (+1e-4, TRL's); a tied group teaches nothing.
    advantages, _ = group_advantages(scores.sum(dim=1), group_size=3)
    assert advantages.tolist() == pytest.approx([-1 / 1.0001, 0.0, 1 / 1.0001, 0.0, 0.0, 0.0], abs=1e-7)


def _exact_log(value: float) -> float:
    """A float64 x whose exp is exactly ``value``: log(value), or one of its nearest neighbours."""
    near, low, high = [math.log(value)], math.log(value), math.log(value)
    for _ in range(8):
        low, high = math.nextafter(low, -math.inf), math.nextafter(high, math.inf)
        near += [low, high]
    return next(x for x in near if torch.exp(torch.tensor(x, dtype=torch.float64)).item() == value)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_clip_bounds_sit_at_one_plus_and_minus_epsilon(sign):
    # Ratios exactly at 1 − ε and 1 + ε and one float64 step beyond each: the clipped surrogate keeps a
    # token's gradient (−A·ratio per unit log-probability) unless the ratio is past the bound in the
    # direction A pushes. A bound moved by any amount, or a strict comparison made loose, is caught.
    epsilon = 0.2
    ratios = [math.nextafter(1 - epsilon, 0), 1 - epsilon, 1.0, 1 + epsilon, math.nextafter(1 + epsilon, 2)]
    logps = torch.tensor([[_exact_log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    advantage = torch.tensor([sign], dtype=torch.float64)
    losses, _, low, high = token_losses(logps, torch.zeros_like(logps), None, advantage, epsilon=epsilon, beta=0.0)
    losses.sum().backward()
    # Pushed up, past 1 + ε the gain is capped and the gradient gone; pushed down, below 1 − ε likewise.
    clipped = [False, False, False, False, True] if sign > 0 else [True, False, False, False, False]
    expected = torch.where(torch.tensor(clipped), 0.0, -sign * torch.tensor(ratios, dtype=torch.float64))
    torch.testing.assert_close(logps.grad[0], expected, rtol=1e-12, atol=1e-12)
    # TRL's clip_ratio/low and /high count exactly those tokens.
    assert (low | high)[0].tolist() == clipped and (high.any().item() == (sign > 0))


def test_built_in_rewards():
    row = {"answer": "42"}
    assert correct("What is 40+2?", " 42 ", row) == 1.0 and correct("", "42.", row) == 0.0
    assert integer_format("", "-7", row) == 1.0 and integer_format("", "seven", row) == 0.0
    assert closeness("", "41", row) == 0.5 and closeness("", "x", row) == 0.0
    assert reward_function("chat_testkit:e_share")("", "eel", row) == pytest.approx(2 / 3)  # one of your own


# Runs


MLA = {"attention": "mla", "n_kv_head": 2, "kv_latent_dim": 8, "q_latent_dim": 16}


@pytest.fixture(scope="module")
def mla_parent_run(base_raw, tmp_path_factory) -> Path:
    raw = {**base_raw, "model": {**base_raw["model"], **MLA}}
    return pretrain(raw, tmp_path_factory.mktemp("mla-parent") / "run")


@pytest.fixture
def rl_config(make_config, parent_run, mla_parent_run):
    def make(out_dir: Path, rl=None, attention="gqa", **train):
        parent = mla_parent_run if attention == "mla" else parent_run
        return make_config(
            out_dir,
            model=MLA if attention == "mla" else {},  # the parent's shape
            data={"format": "rl"},
            train={"init_from": str(parent), "max_steps": 4, "batch_size": 2, "grad_accum_steps": 2,
                   "lr": 1e-2, "min_lr": 1e-2, "warmup_steps": 0, **train},
            eval={"interval": 2, "max_batches": 2, "sample_tokens": 4, "final_max_batches": 2},
            run={"checkpoint_interval": 1},
            rl={"group_size": 3, "max_new_tokens": 4, "rewards": ["chat_testkit:e_share", "closeness"],
                "eval_samples": 2, "updates_per_batch": 2, "beta": 0.1,
                "arithmetic": {"train_problems": 40, "val_problems": 8, "max_operand": 9}, **(rl or {})},
        )

    return make


@pytest.mark.parametrize("attention, lora", [("gqa", None), ("gqa", {"rank": 2}), ("mla", {"rank": 2}),
                                             ("calculator", None)],
                         ids=["gqa-full", "gqa-lora", "mla-lora", "calculator"])
def test_an_rl_run_logs_trl_names_evaluates_pass_at_k_and_resumes_exactly(rl_config, request, tmp_path, attention,
                                                                          lora):
    tools = attention == "calculator"  # in the loop, from the tiny run that calls it (conftest's tool_rl_config)
    make = request.getfixturevalue("tool_rl_config") if tools else partial(rl_config, lora=lora, attention=attention)
    whole = train(make(tmp_path / "whole"), progress=False)
    records = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    own = (["rewards/tool_answer_correct/mean", "rewards/tool_format/mean", "tools/call_frequency",
            "tools/failure_frequency", "tools/calling_ratio", "tools/parsed_ratio"] if tools else
           ["rewards/chat_testkit:e_share/mean", "rewards/closeness/mean"])
    for name in ("reward", "reward_std", "frac_reward_zero_std", "kl", "clip_ratio/region_mean",
                 "completions/mean_length", "completions/clipped_ratio", *own):
        assert all(name in r for r in steps), name
    # The policy starts as the reference, and the first update of a sampled batch is on-policy.
    assert steps[0]["kl"] == 0 and steps[0]["clip_ratio/region_mean"] == 0
    # The second update reuses the batch after the policy moved: the first batch whose groups carried
    # a signal (one whose every group got equal rewards moves nothing, whatever the sampler drew).
    moved = next(i for i in range(0, len(steps), 2) if steps[i]["frac_reward_zero_std"] < 1)
    assert steps[moved]["kl"] == 0 and steps[moved + 1]["kl"] > 0
    assert steps[0]["reward"] == steps[1]["reward"]  # the same sampled batch, twice
    final = next(r for r in records if r["kind"] == "final_eval")
    assert 0 <= final["val_pass@1"] <= final["val_pass@2"] <= 1
    assert whole.val_words == f"held-out pass@1 {final['val_pass@1']:.3f}, pass@2 {final['val_pass@2']:.3f}"
    # Its own numbers: no bits per byte (it has none), no loss per token, and its kept weights by pass@1.
    summary = train_cli.summary(whole, None)
    assert "val_bpb" not in final
    assert "nats/token" not in summary and "bits/byte" not in summary and "validation loss" not in summary
    assert "the best held-out pass@1 seen" in summary or "no periodic evaluation" in summary
    assert final["samples"] and all(s["prompt"].endswith("<|assistant|>") for s in final["samples"])
    if tools:  # its model calls: its replies are multi-turn, and the samples show the calls and their results
        assert all(r["tools/calling_ratio"] > 0 for r in steps) and "val_tools/parsed_ratio" in final
        assert any("<|tool|>" in s["reply"] for s in final["samples"])
    else:
        assert "--chat --prompt 'What is " in summary  # a question of the kind it learned

    # Each batch serves two updates (rl.updates_per_batch), sampled at steps 1 and 3. Stopped after step 3,
    # between the two updates of a batch, the resumed run must train on the pending rollout; stopped after
    # step 2, at a sampling boundary, it must sample step 3's batch from the restored generator. The
    # final weights are compared (the trainer state's, not model.safetensors: the kept weights may be
    # an earlier step's). The LoRA runs stopped after step 3 resume from a checkpoint in the layout of
    # before tasks had a state of their own, the pending rollout in the batches' state.
    final = load_trainer_state(tmp_path / "whole")["model"]
    for stop in (3, 2):
        out = tmp_path / f"resumed-{stop}"
        train(make(out, max_steps=stop), progress=False)
        if stop == 3 and lora:
            state = load_trainer_state(out)
            for rank in state["ranks"]:
                rank["batches"].update(rank.pop("task"))  # the old layout
            assert state["ranks"][0]["batches"]["pending"] is not None  # stopped between the updates
            save_checkpoint(out, None, {k: v for k, v in state.items() if k != "format_version"})
        resumed = train(make(out), resume=True, progress=False)
        state = load_trainer_state(out)
        assert resumed.step == whole.step == state["step"] == 4
        torch.testing.assert_close(state["model"], final, rtol=0, atol=0, msg=lambda m: f"stopped at {stop}: {m}")
        resumed_steps = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
        assert [r["reward"] for r in resumed_steps] == [r["reward"] for r in steps], f"stopped at {stop}"


# The rl section's refusals, read without a parent run (it is read when the run starts): the sections
# laid over an rl config, and the part of the one-line message they must give.
RL_REFUSALS = [
    ({"rl": {"grup_size": 2}}, "unknown config key 'rl.grup_size'; did you mean 'rl.group_size'?"),
    ({"rl": {"group_size": 1}}, "rl.group_size must be greater than or equal to 2, got 1"),
    ({"rl": {"group_size": 10**9}}, "rl.group_size must be less than or equal to 1024, got 1000000000"),
    ({"rl": {"eval_samples": 0}}, "rl.eval_samples must be greater than or equal to 1, got 0"),
    ({"rl": {"eval_samples": 1025}}, "rl.eval_samples must be less than or equal to 1024, got 1025"),
    ({"rl": {"max_new_tokens": 0}}, "rl.max_new_tokens must be greater than or equal to 1, got 0"),
    ({"rl": {"temperature": 1e300}}, "rl.temperature must be less than or equal to 10, got 1e+300"),
    ({"rl": {"temperature": 1e-30}}, "rl.temperature must be greater than or equal to 0.1, got 1e-30"),
    ({"rl": {"temperature": float("nan")}}, "rl.temperature must be less than or equal to 10, got nan"),
    ({"rl": {"beta": float("inf")}}, "rl.beta must be less than or equal to 10, got inf"),
    ({"rl": {"beta": -0.1}}, "rl.beta must be greater than or equal to 0, got -0.1"),
    ({"rl": {"epsilon": 1.0}}, "rl.epsilon must be less than 1, got 1.0"),
    ({"rl": {"epsilon": 0}}, "rl.epsilon must be greater than 0, got 0"),
    ({"rl": {"updates_per_batch": 0}}, "rl.updates_per_batch must be greater than or equal to 1, got 0"),
    ({"rl": {"rewards": []}}, "rl.rewards must have at least 1 item"),
    ({"rl": {"rewards": ["correct", "correct"]}}, "rl.rewards names one twice: ['correct', 'correct']"),
    ({"rl": {"rewards": ["corect"]}}, "rl.rewards: unknown reward 'corect'"),
    ({"rl": {"rewards": ["correct", "tool_format"], "tools": ["calculator"]}},
     "rl.rewards: correct reads a reply as a bare answer, but with rl.tools a reply holds its calls"),
    ({"rl": {"tools": ["calculater"]}}, "rl.tools: unknown tool 'calculater'"),
    ({"rl": {"max_tool_calls": 0}}, "rl.max_tool_calls must be greater than or equal to 1, got 0"),
    ({"rl": {"max_tool_calls": 17}}, "rl.max_tool_calls must be less than or equal to 16, got 17"),
    ({"rl": {"task": "chess"}}, "rl.task must be 'arithmetic' or 'calculator', got 'chess'"),
    ({"rl": {"arithmetic": {"train_problems": 0}}}, "rl.arithmetic.train_problems must be greater than or equal to 1"),
    ({"rl": {"arithmetic": {"train_problems": 10**9}}}, "rl.arithmetic asks for 1,000,000,200 problems, more than the "
                                                        "1,000,000 a run renders and holds at its start"),
    ({"rl": {"arithmetic": {"val_problems": 10**12, "max_operand": 10**12}}}, "more than the 1,000,000 a run renders"),
    ({"rl": {"arithmetic": {"train_problems": 500, "val_problems": 8, "max_operand": 9}}},
     "rl.arithmetic asks for 508 problems but only 100 distinct ones exist"),
    ({"rl": {"arithmetic": {"operations": "++"}}}, "rl.arithmetic.operations must be distinct characters of +-*"),
    ({"rl": {"calculator": {"digits": 5}}}, "rl.calculator.digits must be less than or equal to 4, got 5"),
    ({"rl": {"calculator": {"digits": 1, "operations": "*", "train_problems": 60, "val_problems": 6}}},
     "rl.calculator.train_problems + val_problems is 66, more than half the 100 distinct problems"),
    ({"rl": None}, "data.format: rl needs an rl section (rl: {} takes every default)"),
    ({"data": {"format": "text"}}, "the rl section is for data.format: rl (this run's is text)"),
    ({"train": {"parallel": "fsdp"}}, "data.format: rl trains with train.parallel: ddp"),
    ({"train": {"compile": True}}, "data.format: rl samples through the engine with the plain model; set "
                                   "train.compile: false"),
]


@pytest.mark.parametrize("sections, expected", RL_REFUSALS)
def test_rl_refusals(sections, expected):
    raw = {"train": {"max_steps": 1, "init_from": "runs/parent"}, "data": {"format": "rl"}, "rl": {}}
    with pytest.raises(UserError) as error:
        config_from_dict(merged(raw, sections))
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("rl", [{"group_size": 2, "eval_samples": 1, "max_tool_calls": 1, "temperature": 0.1, "beta": 0},
                                {"group_size": 1024, "eval_samples": 1024, "max_tool_calls": 16, "temperature": 10,
                                 "beta": 10}])
def test_the_rl_bounds_admit_what_is_at_them(rl):
    config = config_from_dict({"train": {"max_steps": 1, "init_from": "p"}, "data": {"format": "rl"}, "rl": rl})
    assert config.rl.model_dump(include=set(rl)) == rl


def test_the_shipped_rl_config_reads(parent_run):
    config = load_run_config(Path(__file__).parents[2] / "configs" / "tiny-rl.yaml",
                             [f"train.init_from={parent_run}", "run.out_dir=unused"])
    assert config.data.format == "rl" and config.rl.group_size == 8 and config.rl.rewards == ["correct", "closeness"]


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
], ids=["divides-by-zero", "reads-a-missing-key", "parses-a-non-number"])  # sys.exit: the run at step two below
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


# (A score of None or NaN is refused in the same words: the table above.)
@pytest.mark.parametrize("failure, code, said", [
    ("raise RuntimeError('the grader is down')", 2,
     "reward '{module}:score' raised RuntimeError: the grader is down for the question 'What is "),
    ("import sys; sys.exit(3)", 2, "reward '{module}:score' called sys.exit(3) for the question 'What is "),
    ("raise KeyboardInterrupt", 130, "interrupted; the last saved checkpoint (if any) is intact"),  # as anywhere else
])
def test_a_reward_that_fails_at_step_two_stops_the_run_there_with_the_checkpoint_untouched(
        rl_config, tmp_path, monkeypatch, capsys, failure, code, said):
    module = _module(tmp_path, monkeypatch, FAILS_LATER.format(failure=failure))
    out, config_file = tmp_path / "run", tmp_path / "rl.yaml"
    # One update per batch: the second step samples (and scores) a new one.
    save_config(rl_config(out, rl={"rewards": [f"{module}:score"], "updates_per_batch": 1}), config_file)
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
