"""Proof against TRL: on the same exported models and reply pairs, our DPO loss and each pair's rewards
equal TRL's ``DPOTrainer.evaluate`` (one pair at a time) in fp32 within 1e-5, and with ``dpo.rpo_alpha``
its RPO (``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, α]``). TRL renders the pairs with the
export's chat template, we with ``data.chat``: the two must agree token for token."""

from pathlib import Path

import pytest
import torch

import run_testkit
from data.chat import Message
from model.config import GPTConfig
from model.gpt import GPT
from model.io import save_pretrained
from training.tasks.dpo.batches import collate_pairs
from training.tasks.dpo.loss import score_pairs
from training.tasks.dpo.pairs import pair_from_row
from training.tasks.dpo.prepared import tokenize_pairs
from training.tasks.reference import FrozenReference

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

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
