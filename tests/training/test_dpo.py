"""Direct preference optimisation: the loss against a direct computation, and a DPO run from a
trained parent that learns the preference, logs TRL's metric names and resumes exactly. The proof against
TRL: on the same exported models and reply pairs, our DPO loss and each pair's rewards equal TRL's
``DPOTrainer.evaluate`` (one pair at a time) in fp32 within 1e-5, and with ``dpo.rpo_alpha`` its RPO
(``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, α]``). TRL renders the pairs with the export's chat
template, we with ``data.chat``: the two must agree token for token."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import training.cli as train_cli
import run_testkit
import training.tasks.dpo.task as dpo_task
from chat_testkit import preference_file
from common.config import merged
from common.errors import UserError
from data.chat import Message
from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained, save_pretrained
from rundir.metrics import read_metrics
from training.config import LoraConfig, config_from_dict, config_to_dict
from training.distributed import init_distributed
from training.lora import LoraAdapters, LowRankDelta, TrainedRows, parametrized
from training.tasks.dpo.batches import collate_pairs
from training.tasks.dpo.loss import accumulate_dpo_gradients, reply_logps, score_pairs
from training.tasks.dpo.pairs import pair_from_row
from training.tasks.dpo.prepared import tokenize_pairs
from training.tasks.reference import AdaptersOffReference, FrozenReference
from training.trainer import Trainer, train

VOCAB = 40


def tiny_gpt(seed: int = 0) -> GPT:
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
    policy, reference = tiny_gpt(0), tiny_gpt(1)
    beta = 0.5
    frozen = FrozenReference(tiny_gpt(1))
    loss, metrics = accumulate_dpo_gradients(policy, frozen, batches, beta=beta)
    grads = {n: p.grad.clone() for n, p in policy.named_parameters()}

    direct = tiny_gpt(0)
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
    torch.testing.assert_close(grads, {n: p.grad for n, p in direct.named_parameters()}, rtol=1e-4, atol=1e-6)
    assert all(p.grad is None and not p.requires_grad for p in frozen.model.parameters())


def test_rpo_adds_alpha_times_the_chosen_replies_mean_token_nll_to_each_pair():
    g = torch.Generator().manual_seed(5)
    x, y = _pair_batch(g, 3)
    beta, alpha = 0.5, 0.8
    policy = tiny_gpt(0)
    loss, metrics = accumulate_dpo_gradients(policy, FrozenReference(tiny_gpt(1)), [(x, y)], beta=beta, rpo_alpha=alpha)
    plain, _ = accumulate_dpo_gradients(tiny_gpt(0), FrozenReference(tiny_gpt(1)), [(x, y)], beta=beta)

    direct = tiny_gpt(0)
    expected, chosen, _ = _direct_dpo(direct, tiny_gpt(1), x, y, beta)
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


@pytest.mark.parametrize("lora", [None, {"rank": 4}], ids=["full", "lora"])  # LoRA: the adapters against the parent
def test_dpo_learns_the_preference_logs_trl_names_and_resumes_exactly(dpo_config, tmp_path, lora):
    options = {"lora": lora} if lora else {}
    whole = train(dpo_config(tmp_path / "whole", **options), progress=False)
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
    if lora:
        assert (tmp_path / "whole" / "adapter_model.safetensors").is_file() and whole.adapter.startswith("LoRA: ")

    train(dpo_config(tmp_path / "resumed", max_steps=4, **options), progress=False)
    resumed = train(dpo_config(tmp_path / "resumed", **options), resume=True, progress=False)
    assert resumed.step == whole.step == 8
    torch.testing.assert_close(load_pretrained(tmp_path / "resumed").state_dict(),
                               load_pretrained(tmp_path / "whole").state_dict(), rtol=0, atol=1e-6)
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
    parent, policy = tiny_gpt(), tiny_gpt()
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


# The proof against TRL
BETA = 0.5
RPO_ALPHA = 0.7
BLOCK_SIZE = 64
ROWS = [
    {"prompt": [{"role": "system", "content": "ROMEO"}, {"role": "user", "content": "But soft, what light?"}],
     "chosen": [{"role": "assistant", "content": "It is the east."}],
     "rejected": [{"role": "assistant", "content": "again and again and again"}]},
    {"prompt": "Wherefore art thou Romeo?", "chosen": "Deny thy father.", "rejected": "Café crème, naïve façade."},
    {"prompt": [{"role": "user", "content": "The quick brown fox?"}, {"role": "assistant", "content": "Jumps."},
                {"role": "user", "content": "Over what?"}],
     "chosen": [{"role": "assistant", "content": "The lazy dog, again."}],
     "rejected": [{"role": "assistant", "content": "世界你好 😀"}]},
    # The second pair the other way round: whatever the weights, one of the two is ranked wrong.
    {"prompt": "Wherefore art thou Romeo?", "chosen": "Café crème, naïve façade.", "rejected": "Deny thy father."},
]
SHAPES = {"gqa": {}, "mla": {"attention": "mla", "n_kv_head": 4, "kv_latent_dim": 16}}


@pytest.fixture(params=sorted(SHAPES))
def exported(request, tmp_path):
    """(policy, reference) as our models and as export folders, with the tokenizer. The policy is the
    reference moved a little, so the rewards are far from zero."""
    from exporting.hf import export_run

    for name in ("trl", "transformers", "datasets"):
        pytest.importorskip(name)
    tokenizer = run_testkit.chat_tokenizer()
    shape = {"n_kv_head": 2, **SHAPES[request.param]}
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=BLOCK_SIZE, n_layer=2, n_head=4, n_embd=64,
                       **shape)
    reference = GPT(config).eval()
    policy = GPT(config).eval()
    policy.load_state_dict(reference.state_dict())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folders = {}
    for name, model in (("policy", policy), ("reference", reference)):
        run = tmp_path / name
        run.mkdir()
        tokenizer.save(str(run / "tokenizer.json"))
        save_pretrained(model, run)
        # Chat-tuned runs, as DPO's policy and reference are: their exports carry the chat template.
        (run / "config.yaml").write_text("data:\n  format: chat\n")
        export_run(run, tmp_path / f"{name}-hf")
        folders[name] = tmp_path / f"{name}-hf"
    return policy, reference, folders, tokenizer


def _trl_trainer(folders: dict[str, Path], tmp_path: Path, rpo_alpha: float):
    import datasets
    import transformers
    import trl

    load = lambda folder: transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    losses = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, rpo_alpha]} if rpo_alpha else {
        "loss_type": ["sigmoid"]}
    # fp32 throughout: TRL's configs default to bf16 autocast.
    args = trl.DPOConfig(output_dir=str(tmp_path / "trl"), beta=BETA, max_length=None, per_device_eval_batch_size=1,
                         report_to=[], use_cpu=True, bf16=False, fp16=False, **losses)
    pairs = datasets.Dataset.from_list([pair_from_row(row, "").to_row() for row in ROWS])
    return trl.DPOTrainer(
        model=load(folders["policy"]), ref_model=load(folders["reference"]), args=args, train_dataset=pairs,
        processing_class=transformers.AutoTokenizer.from_pretrained(folders["policy"], trust_remote_code=True),
    )


@pytest.mark.parametrize("rpo_alpha", [0.0, RPO_ALPHA], ids=["dpo", "rpo"])
def test_loss_and_rewards_equal_trls_dpo_trainer(exported, tmp_path, rpo_alpha):
    import datasets

    policy, reference, folders, tokenizer = exported
    pairs = [pair_from_row(row, f"row {i}") for i, row in enumerate(ROWS)]
    assert pairs[1].prompt == (Message("user", "Wherefore art thou Romeo?"),)  # text rows as one turn each
    split, stats = tokenize_pairs(tokenizer, pairs, BLOCK_SIZE)
    assert stats["pairs"] == len(ROWS) and stats["dropped"] == stats["cut"] == 0
    trainer = _trl_trainer(folders, tmp_path, rpo_alpha)
    ours_frozen = FrozenReference(reference)
    signs = set()
    for i, row in enumerate(ROWS):
        x, y = collate_pairs(split, [i], pad_id=0)
        with torch.no_grad():
            losses, sums, _ = score_pairs(policy, ours_frozen, x, y, BETA, None, rpo_alpha)
            plain, _, _ = score_pairs(policy, ours_frozen, x, y, BETA, None)
        chosen, rejected = sums[2].item(), sums[3].item()
        theirs = trainer.evaluate(eval_dataset=datasets.Dataset.from_list([pairs[i].to_row()]))
        assert losses.item() == pytest.approx(theirs["eval_loss"], abs=1e-5)
        # RPO's term is really there: α times the chosen reply's mean token NLL (several nats here).
        assert (losses - plain).item() > 1.0 if rpo_alpha else torch.equal(losses, plain)
        assert chosen == pytest.approx(theirs["eval_rewards/chosen"], abs=1e-5)
        assert rejected == pytest.approx(theirs["eval_rewards/rejected"], abs=1e-5)
        assert abs(chosen) > 1e-2 and abs(rejected) > 1e-2  # the policy really differs from the reference
        signs.add(chosen > rejected)
    assert signs == {True, False}, "the pairs should include a right and a wrong ranking"
