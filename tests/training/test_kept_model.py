"""The run keeps the weights that validated best: a run that overfits saves its best evaluated
weights as model.safetensors, the last state stays in the checkpoint, and a resume is still exact."""

import random
import signal
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch

from data.prepared.text import prepare_data
from data.sources.documents import hash_split
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from rundir.metrics import read_metrics
from test_training_loop import deterministic, interrupt_at
from training.config import config_from_dict
from training.evaluate import evaluate
from training.kept_model import CorpusCheck, KeptModel
from training.result import Words
from training.trainer import train

SPLIT_SEED = 1234


@pytest.fixture(scope="module")
def diverging_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Documents whose held-out ones use words the training ones never do: once the model has
    learnt the shared structure, every further step on the training words makes validation worse,
    so the best evaluation comes early and the last one is worse, whatever the machine."""
    folder = tmp_path_factory.mktemp("diverging")
    names = [f"doc{i:02d}.txt" for i in range(20)]
    _, val = hash_split(names, 0.2, SPLIT_SEED)
    train_words = [c * 3 for c in "abcdefghij"]
    val_words = train_words[:5] + [c * 3 for c in "klmno"]
    rng = random.Random(0)
    for i, name in enumerate(names):
        words = val_words if i in val else train_words
        (folder / name).write_text(" ".join(rng.choice(words) for _ in range(60)) + ".\n", encoding="utf-8")
    return folder


def _config(corpus: Path, out_dir: Path, **train):
    return config_from_dict({
        "model": {"n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "block_size": 32},
        "data": {"source": "files", "vocab_size": 300, "cache_dir": str(corpus / "cache"), "val_fraction": 0.2,
                 "split_seed": SPLIT_SEED, "files": {"paths": [str(corpus / "*.txt")]}},
        "train": {"max_steps": 20, "batch_size": 8, "lr": 1e-2, "min_lr": 1e-2, "warmup_steps": 3, "device": "cpu",
                  "compile": False, "peak_flops": 1e11, **train},
        "eval": {"interval": 5, "max_batches": 2, "sample_tokens": 4, "final_max_batches": None},
        "logging": {"interval": 1, "wandb": {"mode": "disabled"}},
        "run": {"checkpoint_interval": 4, "out_dir": str(out_dir)},
    })


def _score(model, config, max_batches):
    """``model``'s loss over the run's validation split, the first ``max_batches`` batches of it."""
    val_tokens = prepare_data(config.data, progress=False).val_tokens()
    return evaluate(model, val_tokens, torch.ones(model.config.vocab_size, dtype=torch.long), block_size=32,
                    batch_size=8, max_batches=max_batches, device=torch.device("cpu")).loss


def test_an_overfitting_run_keeps_its_best_evaluated_weights_and_a_resume_the_same_bit_for_bit(diverging_corpus,
                                                                                                tmp_path, monkeypatch):
    config = _config(diverging_corpus, tmp_path / "run", max_steps=22)  # not a multiple of eval.interval
    result = train(config, progress=False)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    # The last step is evaluated on the subset too, so the last weights compete.
    assert [r["step"] for r in evals] == [5, 10, 15, 20, 22]
    best = min(evals, key=lambda r: r["val_loss"])
    assert best["step"] != 22 and evals[-1]["val_loss"] > best["val_loss"]  # the case this test is for
    assert (result.kept_step, result.kept_val_loss) == (best["step"], best["val_loss"])
    assert result.last_val_loss == evals[-1]["val_loss"]

    # model.safetensors holds the kept weights: scored on the same subset, they give the best loss.
    kept = load_pretrained(tmp_path / "run")
    assert _score(kept, config, 2) == pytest.approx(best["val_loss"], abs=1e-6)
    # The final full validation scores those weights, and says which step they are from.
    final = next(r for r in records if r["kind"] == "final_eval")
    assert final["weights_step"] == best["step"] and final["val_loss"] == pytest.approx(_score(kept, config, None),
                                                                                         abs=1e-6)
    assert result.val_loss == final["val_loss"]
    # The last state stays in the checkpoint, for --resume.
    state = load_trainer_state(tmp_path / "run")
    assert state["step"] == 22 and state["kept"]["step"] == best["step"]
    last = state["model"]
    assert any(not torch.equal(last[k], v) for k, v in kept.state_dict().items() if k in last)

    broken = _config(diverging_corpus, tmp_path / "broken", max_steps=22)
    interrupt_at(monkeypatch, 13)  # after an evaluation has kept weights, before the end
    stopped = train(broken, progress=False)
    monkeypatch.undo()
    assert stopped.interrupted and stopped.signal == signal.SIGTERM and stopped.kept_step is not None
    resumed = train(broken, resume=True, progress=False)
    assert (resumed.kept_step, resumed.kept_val_loss) == (result.kept_step, result.kept_val_loss)
    for load in (lambda run: load_pretrained(run).state_dict(), lambda run: load_trainer_state(run)["model"]):
        a, b = load(tmp_path / "run"), load(tmp_path / "broken")  # the kept weights and the last ones
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert deterministic(read_metrics(tmp_path / "broken" / "metrics.jsonl")) == deterministic(records)


def test_kept_weights_change_only_on_a_lower_loss_over_the_same_subset():
    kept = KeptModel(subset=(8, 16))
    assert kept.record(10, 2.0) and kept.record(20, 1.5)
    assert not kept.record(30, 1.5)  # a tie keeps the earlier weights
    assert not kept.record(40, 1.7)
    assert (kept.step, kept.val_loss, kept.evaluated_step) == (20, 1.5, 40)
    # Losses over another subset do not compare: a resume with other eval settings starts afresh.
    other = KeptModel(subset=(4, 16))
    assert not other.load_state_dict(kept.state_dict()) and other.step is None
    same = KeptModel(subset=(8, 16))
    assert same.load_state_dict(kept.state_dict()) and (same.step, same.val_loss) == (20, 1.5)


@pytest.mark.parametrize("steps, warned", [(100, None), (101, "about 10 epochs"), (3300, "about 330 epochs")])
def test_a_budget_of_many_epochs_is_warned_about_once(steps, warned):
    # Warned in the task's words, once; a task that counts no epochs (RL) or has no words for them is silent.
    bar = SimpleNamespace(schedule=SimpleNamespace(max_seconds=None), expected_steps=lambda step, elapsed: steps)
    check = CorpusCheck(10.0, 64, None, Words(epochs="the training split (33,000 tokens): learnt by heart"))
    line = check.warning(bar, 0, 0.0)
    assert line == (None if warned is None else f"warning: the budget is {warned} of the training split (33,000 "
                    "tokens): learnt by heart")
    assert check.warning(bar, 1, 0.0) is None
    assert CorpusCheck(None, 64, None, check.words).warning(bar, 0, 0.0) is None
    assert CorpusCheck(10.0, 64, None, Words()).warning(bar, 0, 0.0) is None


def test_a_lora_run_keeps_its_best_merged_weights_and_scores_them_at_the_end(diverging_corpus, tmp_path):
    # The kept weights are merged ones: the final pass scores what model.safetensors holds, not the last adapters.
    train(_config(diverging_corpus, tmp_path / "parent", max_steps=5), progress=False)
    config = _config(diverging_corpus, tmp_path / "run", max_steps=22, lr=3e-2, min_lr=3e-2,
                     init_from=str(tmp_path / "parent"), lora={"rank": 4})
    result = train(config, progress=False)
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    best = min(evals, key=lambda r: r["val_loss"])
    assert best["step"] != 22 and result.kept_step == best["step"]  # the case this test is for
    assert result.val_loss == pytest.approx(_score(load_pretrained(tmp_path / "run"), config, None), abs=1e-6)
