"""Direct preference optimisation: the loss against a direct computation, and a DPO run from a
trained parent that learns the preference, logs TRL's metric names and resumes exactly."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import training.cli as train_cli
import training.tasks.dpo.task as dpo_task
from chat_testkit import preference_file
from common.config import merged
from common.errors import UserError
from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.metrics import read_metrics
from training.config import LoraConfig, config_from_dict, config_to_dict
from training.distributed import init_distributed
from training.lora import LoraAdapters, LowRankDelta, TrainedRows, parametrized
from training.tasks.dpo.loss import accumulate_dpo_gradients, reply_logps
from training.tasks.reference import AdaptersOffReference, FrozenReference
from training.trainer import Trainer, train

VOCAB = 40


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))


def _pair_batch(generator: torch.Generator, pairs: int, width: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch laid out as training.tasks.dpo.batches makes them: chosen rows, then rejected rows,
    the targets -1 over each row's prompt and padding."""
    x = torch.randint(0, VOCAB, (2 * pairs, width), generator=generator)
    y = torch.randint(0, VOCAB, (2 * pairs, width), generator=generator)
    for row in range(2 * pairs):
        start = int(torch.randint(1, 5, (), generator=generator))
        end = int(torch.randint(start + 1, width + 1, (), generator=generator))
        y[row, :start] = -1
        y[row, end:] = -1
    return x, y


def _direct_dpo(policy: GPT, reference: GPT, x: torch.Tensor, y: torch.Tensor, beta: float):
    """The DPO loss and rewards written out from the log-softmax, one row at a time."""
    def summed(model: GPT, row: int) -> torch.Tensor:
        logp = torch.log_softmax(model(x[row:row + 1])[0].double(), dim=-1)
        keep = y[row] != -1
        return logp[keep].gather(1, y[row][keep][:, None]).sum()

    n = len(x) // 2
    losses, chosen, rejected = [], [], []
    for i in range(n):
        with torch.no_grad():
            ref_c, ref_r = summed(reference, i), summed(reference, n + i)
        c = beta * (summed(policy, i) - ref_c)
        r = beta * (summed(policy, n + i) - ref_r)
        losses.append(torch.log1p(torch.exp(-(c - r))))
        chosen.append(c.detach())
        rejected.append(r.detach())
    return torch.stack(losses).mean(), torch.stack(chosen), torch.stack(rejected)


def test_a_step_over_micro_batches_is_the_mean_dpo_loss_over_all_its_pairs():
    g = torch.Generator().manual_seed(4)
    batches = [_pair_batch(g, 3), _pair_batch(g, 3)]
    policy, reference = _model(0), _model(1)
    beta = 0.5
    frozen = FrozenReference(_model(1))
    loss, metrics = accumulate_dpo_gradients(policy, frozen, batches, beta=beta)
    grads = {n: p.grad.clone() for n, p in policy.named_parameters()}

    direct = _model(0)
    # One batch of all six pairs: every chosen row, then every rejected row.
    x, y = (torch.cat([b[k][:3] for b in batches] + [b[k][3:] for b in batches]) for k in (0, 1))
    expected, chosen, rejected = _direct_dpo(direct, reference, x, y, beta)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["rewards/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-5)
    assert metrics["rewards/rejected"] == pytest.approx(rejected.mean().item(), abs=1e-5)
    assert metrics["rewards/margins"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-5)
    assert metrics["rewards/accuracies"] == pytest.approx((chosen > rejected).double().mean().item())
    assert 0 < metrics["rewards/accuracies"] < 1  # the batch tells a right ranking from a wrong one
    for name, p in direct.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert all(p.grad is None and not p.requires_grad for p in frozen.model.parameters())


def test_rpo_adds_alpha_times_the_chosen_replies_mean_token_nll_to_each_pair():
    g = torch.Generator().manual_seed(5)
    x, y = _pair_batch(g, 3)
    beta, alpha = 0.5, 0.8
    policy = _model(0)
    loss, metrics = accumulate_dpo_gradients(policy, FrozenReference(_model(1)), [(x, y)], beta=beta, rpo_alpha=alpha)
    plain, _ = accumulate_dpo_gradients(_model(0), FrozenReference(_model(1)), [(x, y)], beta=beta)

    direct = _model(0)
    expected, chosen, _ = _direct_dpo(direct, _model(1), x, y, beta)
    logp = torch.log_softmax(direct(x[:3]).double(), dim=-1)
    keep = y[:3] != -1
    nll = -logp[keep].gather(1, y[:3][keep][:, None]).mean()  # over every chosen token of the batch
    (expected + alpha * nll).backward()
    assert loss.item() == pytest.approx((expected + alpha * nll).item(), rel=1e-5)
    assert loss.item() - plain.item() == pytest.approx(alpha * nll.item(), rel=1e-4) and nll.item() > 1.0
    assert metrics["rewards/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-5)  # rewards stay DPO's
    for name, p in direct.named_parameters():
        torch.testing.assert_close(policy.get_parameter(name).grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


# The dpo section's refusals, read without a parent run (it is read when the run starts).
DPO_REFUSALS = [
    ({"dpo": {"bta": 1}}, "unknown config key 'dpo.bta'; did you mean 'dpo.beta'?"),
    ({"dpo": {"beta": 0.0}}, "dpo.beta must be greater than 0, got 0.0"),
    ({"dpo": {"beta": 1e300}}, "dpo.beta must be less than or equal to 10, got 1e+300"),
    ({"dpo": {"beta": math.nan}}, "dpo.beta must be less than or equal to 10, got nan"),
    # a step past each bound
    ({"dpo": {"rpo_alpha": math.nextafter(0.0, -1)}}, "dpo.rpo_alpha must be greater than or equal to 0, got -5e-324"),
    ({"dpo": {"rpo_alpha": math.nextafter(10.0, 11)}}, "dpo.rpo_alpha must be less than or equal to 10, got 10.000000"),
    ({"dpo": {"rpo_alpha": math.inf}}, "dpo.rpo_alpha must be less than or equal to 10, got inf"),
    ({"train": {"dpo_beta": 0.5}}, "train.dpo_beta is now dpo.beta, in a dpo: section beside train:"),
    ({"train": {"dpo_rpo_alpha": 1.0}}, "train.dpo_rpo_alpha is now dpo.rpo_alpha, in a dpo: section"),
    ({"data": {"format": "chat"}, "dpo": {"beta": 0.2}}, "the dpo section is for data.format: preference (this run's "
                                                         "is chat)"),
]


@pytest.mark.parametrize("sections, expected", DPO_REFUSALS)
def test_dpo_refusals(sections, expected):
    raw = {"train": {"max_steps": 1, "init_from": "p"}, "data": {"format": "preference", "source": "files",
                                                                 "files": {"paths": ["p.jsonl"]}}}
    with pytest.raises(UserError) as error:
        config_from_dict(merged(raw, sections))
    assert expected in str(error.value) and "\n" not in str(error.value)
    at_bounds = config_from_dict(merged(raw, {"dpo": {"beta": 10, "rpo_alpha": 10}}))
    assert (at_bounds.dpo.beta, at_bounds.dpo.rpo_alpha) == (10.0, 10.0)


@pytest.fixture
def dpo_config(make_config, parent_run, tmp_path):
    data_file = preference_file(tmp_path / "pairs.jsonl")

    def make(out_dir: Path, dpo=None, **train):
        return make_config(
            out_dir,
            data={"format": "preference", "files": {"paths": [str(data_file)]}, "val_fraction": 0.2},
            dpo={"beta": 0.5, **(dpo or {})},
            train={"init_from": str(parent_run), "max_steps": 8, "batch_size": 4, "grad_accum_steps": 2,
                   "lr": 3e-3, "min_lr": 3e-3, "warmup_steps": 0, **train},
            eval={"interval": 4, "max_batches": 2, "sample_tokens": 6, "final_max_batches": None},
            run={"checkpoint_interval": 4},
        )

    return make


def test_dpo_learns_the_preference_logs_trl_names_and_resumes_exactly(dpo_config, tmp_path):
    whole = train(dpo_config(tmp_path / "whole"), progress=False)
    records = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    first = next(r for r in records if r["kind"] == "train")
    # The policy starts as the reference: every reward is 0 and the loss is -log σ(0) = log 2.
    assert first["step"] == 1 and first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert [first[f"rewards/{key}"] for key in ("chosen", "rejected", "margins", "accuracies")] == [0, 0, 0, 0]
    assert first["beta"] == 0.5
    final = next(r for r in records if r["kind"] == "final_eval")
    # Held out: every pair of the split, scored after training on the others.
    assert final["val_rewards/accuracies"] >= 0.9 and final["val_rewards/margins"] > 0
    assert final["val_loss"] < math.log(2)
    assert final["samples"] and all(s["prompt"].endswith("<|assistant|>") for s in final["samples"])
    # The run speaks its own numbers: the DPO loss and TRL's rewards/*, not a text run's loss per token.
    summary = train_cli.summary(whole, None)
    assert (f"final validation: DPO loss {final['val_loss']:.4f}, rewards/accuracies "
            f"{final['val_rewards/accuracies']:.3f}, rewards/margins {final['val_rewards/margins']:.4f} on held-out "
            "pairs; ") in summary
    assert "nats/token" not in summary and "of assistant text" not in summary
    assert "the best held-out DPO loss seen" in summary
    assert f"python -m benchmarks.chat_eval --runs {whole.parent} {whole.run_dir}" in summary  # beside its parent's

    train(dpo_config(tmp_path / "resumed", max_steps=4), progress=False)
    resumed = train(dpo_config(tmp_path / "resumed"), resume=True, progress=False)
    assert resumed.step == whole.step == 8
    b = load_pretrained(tmp_path / "resumed").state_dict()
    for name, tensor in load_pretrained(tmp_path / "whole").state_dict().items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert resumed.val_loss == pytest.approx(whole.val_loss, abs=1e-6)


def test_a_handful_of_pairs_is_warned_about_as_a_small_corpus_is(make_config, parent_run, tmp_path, capsys):
    # 12 pairs, a few held out: a budget of 16 steps of 8 pairs passes over the rest more than 10 times.
    data_file = preference_file(tmp_path / "few.jsonl", count=12)
    config = make_config(tmp_path / "run", data={"format": "preference", "files": {"paths": [str(data_file)]},
                                                 "val_fraction": 0.2},
                         train={"init_from": str(parent_run), "max_steps": 16, "batch_size": 4, "grad_accum_steps": 2},
                         eval={"interval": 0, "max_batches": 1, "sample_tokens": 0, "final_max_batches": None})
    assert config_to_dict(config)["dpo"] == {"beta": 0.1, "rpo_alpha": 0.0}  # no dpo section: its defaults, saved
    result = train(config, progress=False)
    said = capsys.readouterr().out.splitlines()
    held_out = [line for line in said if line.startswith("warning: only ")]
    assert held_out and "held-out pairs: rewards/accuracies moves in steps of" in held_out[0]
    assert result.epochs > 10 and (pairs := round(16 * 8 / result.epochs)) < 12
    assert (f"warning: the budget is about {result.epochs:.0f} epochs of the {pairs} training pairs: DPO learns so "
            "few pairs by heart") in "\n".join(said)


def test_fsdp_is_refused_before_any_data_is_read(dpo_config, tmp_path, monkeypatch):
    monkeypatch.setattr(dpo_task, "prepare_preference_data", lambda *a, **k: pytest.fail("read the data"))
    config = dpo_config(tmp_path / "run", parallel="fsdp")
    with pytest.raises(UserError, match="data.format: preference trains with train.parallel: ddp"):
        Trainer(config, init_distributed("cpu"), progress=False).setup(resume=False, overwrite=False)


def test_a_lora_policy_with_its_adapters_off_is_the_frozen_reference():
    # A LoRA DPO run holds no second model: its policy with the adapters off gives the parent's
    # log-probabilities, though the adapters have moved it.
    parent, policy = _model(), _model()
    adapters = LoraAdapters(LoraConfig(rank=2, trainable_tokens=["<|end|>"]))
    adapters.apply(policy, SimpleNamespace(token_to_id={"<|end|>": 3}.get))
    with torch.no_grad():
        for _, _, delta in parametrized(policy, LowRankDelta):
            delta.lora_B.normal_()
        for _, _, rows in parametrized(policy, TrainedRows):  # the end token's row moved too, and is off with the adapters
            rows.rows.normal_()
    x, y = _pair_batch(torch.Generator().manual_seed(0), pairs=3)
    expected = reply_logps(FrozenReference(parent).logits(parent, x), y)
    policy.train()
    got = reply_logps(AdaptersOffReference(adapters).logits(policy, x), y)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert policy.training  # back in the mode it was in
    moved = reply_logps(policy(x), y).detach()  # adapters on
    assert (moved - expected).abs().max() > 1e-2


def test_a_lora_dpo_run_trains_the_adapters_against_the_parent(dpo_config, tmp_path):
    result = train(dpo_config(tmp_path / "lora", lora={"rank": 4}), progress=False)
    records = read_metrics(tmp_path / "lora" / "metrics.jsonl")
    first = next(r for r in records if r["kind"] == "train")
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6) and first["rewards/margins"] == 0
    final = next(r for r in records if r["kind"] == "final_eval")
    assert final["val_rewards/margins"] > 0 and final["val_loss"] < math.log(2)
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file() and result.adapter.startswith("LoRA: ")
