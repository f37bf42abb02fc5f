"""--resume with settings the checkpoint depends on, with a damaged trainer state or a damaged
metrics.jsonl: one clear error naming the key or file, or a resume that keeps the good lines. A
post-training run measures itself against its parent's weights (DPO's rewards, GRPO's KL): resumed after
those weights changed, it is refused in one line, before anything is written, where its reference is a
frozen copy read from the parent's file. A LoRA run's reference comes from its own checkpoint, and a GRPO
run without a KL penalty has none: both resume."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import training.trainer as trainer_module
from chat_testkit import preference_file
from common.errors import UserError
from exporting.cli import main as export
from inference.cli import main as generate
from model.io import load_pretrained, save_pretrained
from rundir.checkpoint import CheckpointError, load_trainer_state
from rundir.metrics import read_metrics
from training.config import load_run_config
from training.init_from import InitFromError
from training.trainer import train

QUIET = {"interval": 0, "sample_tokens": 0}


def test_damaged_metrics_lines_are_dropped_and_the_good_ones_kept(make_config):
    config = make_config(train={"max_steps": 2}, logging={"interval": 1, "wandb": {"mode": "disabled"}}, eval=QUIET)
    train(config, progress=False)
    metrics = config.out_dir / "metrics.jsonl"
    good = read_metrics(metrics)
    with open(metrics, "ab") as f:
        f.write(b"[1, 2]\n\"just a string\"\n\xff\xfe\x00garbage\n{\"step\": \"x\"}\n\x80\x81 torn")
    train(make_config(train={"max_steps": 3}, eval=QUIET), resume=True, progress=False)
    records = read_metrics(metrics)
    assert records[: len(good)] == [r for r in good if r["step"] <= 2]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]


def _snapshot(run_dir):  # every file of the run but the lock a command takes on it
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.startswith(".run.lock")}


def _edit_state(edit):  # a damage: ``edit`` applied to the run's trainer state, saved back
    def damage(run_dir):
        state = torch.load(run_dir / "trainer_state.pt", weights_only=True)
        edit(state)
        torch.save(state, run_dir / "trainer_state.pt")
    return damage


def _earlier_grouping(state):
    # Before train.value_embedding_lr the value-embedding tables shared the AdamW group of the
    # embedding and the norm gains: such a state cannot resume, and the error says what can.
    groups = state["optimizer"].get("param_groups") or state["optimizer"]["adamw"]["param_groups"]
    groups[-2]["params"] += groups.pop()["params"]  # the tables back in the group before them


class _NotATensor:
    """Unpickling this needs code execution: weights_only refuses it."""


def _metrics_folder(run_dir):
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").mkdir()


# Each refusal of --resume: the first run's train and model settings (None: no first run), what then
# happened to its folder, the resume's train settings, and the part of the one-line message it expects.
VE = {"value_embeddings": True}
RESUME_REFUSALS = {
    "fixed-optimizer": ({"optimizer": "muon"}, {}, None, {"optimizer": "adamw"}, "train.optimizer is .* may not change"),
    "fixed-sampling": ({"sampling": "epoch"}, {}, None, {"sampling": "random"}, "train.sampling is .* may not change"),
    "fixed-seed": ({"seed": 1}, {}, None, {"seed": 2}, "train.seed is .* may not change on resume"),
    "model-shape": ({}, {}, None, {"model": {"n_embd": 64}}, "model.n_embd is 64 in the config but 32"),
    **{f"state-without-{key}": ({}, {}, _edit_state(lambda state, key=key: state.pop(key)), {},
                                rf"does not fit this config \(missing '{key}'\)") for key in ("optimizer", "ranks", "step")},
    "earlier-grouping": ({}, VE, _edit_state(_earlier_grouping), {"model": VE}, "groups the parameters as .* train.init_from="),
    "pickle-with-code": ({}, {}, _edit_state(lambda state: state.update(payload=_NotATensor())), {}, "is not loaded"),
    "metrics-a-folder": ({}, {}, _metrics_folder, {}, "metrics.jsonl is not a file; move it aside"),
    "state-a-folder": ({}, {}, lambda run: ((run / "trainer_state.pt").unlink(), (run / "trainer_state.pt").mkdir()), {},
                       r"trainer_state.pt is not a file \(a folder\?\)"),
    "no-tokenizer": ({}, {}, lambda run: (run / "tokenizer.json").unlink(), {},
                     "cannot resume .*: it has no tokenizer.json; restore the run's own"),
    "finished-by-clock": ({}, {}, None, {"max_steps": 5, "max_minutes": 1e-6},
                          r"reached train.max_minutes .* --set train.max_minutes=2e-06"),
    "no-checkpoint": (None, {}, None, {}, "no checkpoint"),
}


@pytest.mark.parametrize("first, model, damage, resumed, fragment", RESUME_REFUSALS.values(), ids=RESUME_REFUSALS)
def test_a_resume_that_cannot_go_on_is_one_line_and_leaves_the_run_as_it_was(make_config, first, model, damage,
                                                                              resumed, fragment):
    run_dir = make_config().out_dir
    if first is not None:
        train(make_config(model=model, train={"max_steps": 1, **first}, eval=QUIET), progress=False)
    if damage:
        damage(run_dir)
    before = _snapshot(run_dir)
    resumed = dict(resumed)
    config = make_config(model=resumed.pop("model", {}), train={"max_steps": 2, **resumed}, eval=QUIET)
    with pytest.raises(UserError, match=fragment) as info:
        train(config, resume=True, progress=False)
    message = str(info.value)
    assert "\n" not in message and "weights_only" not in message and "can still be loaded" not in message
    after = _snapshot(run_dir)
    if damage is _metrics_folder:  # the resume rewrites config.yaml before it opens metrics.jsonl
        after[Path("config.yaml")] = before[Path("config.yaml")]
    assert after == before


def test_a_finished_run_is_refused_unchanged_finishes_a_lost_final_validation_and_continues_on_a_new_budget(
        make_config, monkeypatch):
    config = make_config(train={"max_steps": 2}, eval=QUIET)
    train(config, progress=False)
    before = _snapshot(config.out_dir)
    monkeypatch.setattr(trainer_module.WandbLogger, "start", lambda *a, **k: pytest.fail("opened a wandb run"))
    with pytest.raises(CheckpointError) as info:
        train(config, resume=True, progress=False)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and f"{config.out_dir} is finished: it reached train.max_steps (step 2)" in message
    assert "raise train.max_steps or train.max_minutes" in message and "--resume --set train.max_steps=4" in message
    assert _snapshot(config.out_dir) == before  # no second validation line, no rewritten config
    # Stopped during its final validation, a resume runs it, once.
    metrics = config.out_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(line for line in lines if '"final_eval"' not in line))
    result = train(config, resume=True, progress=False)
    assert result.step == 2 and result.val_bpb is not None
    assert [r["step"] for r in read_metrics(metrics) if r["kind"] == "final_eval"] == [2]
    # A raised budget continues it, at a new learning rate if asked.
    result = train(make_config(train={"max_steps": 3, "lr": 1e-3}, eval=QUIET), resume=True, progress=False)
    assert result.step == 3 and result.stopped_by == "max_steps"


# Every removed model key at its off value, as a model_config.json written before it left holds it.
REMOVED_OFF = {"bigram_buckets": None, "mtp_weight": 0.0, "mlp": "swiglu", "qk_norm": False, "logit_softcap": None,
               "residual_scalars": False, "zero_init": False}


def test_a_run_saved_with_the_removed_options_off_still_generates_exports_and_resumes(make_config, tmp_path, capsys):
    # Runs written while the removed options existed (the model's up to 9e81adb) record them, off,
    # in model_config.json, config.yaml and the trainer state.
    config = make_config(train={"max_steps": 1}, eval=QUIET)
    train(config, progress=False)
    run = config.out_dir
    greedy = ["--run", str(run), "--prompt", "The", "--max-new-tokens", "8", "--temperature", "0", "--device", "cpu"]
    assert generate(greedy) == 0
    before = capsys.readouterr().out

    model_json = run / "model_config.json"
    model_json.write_text(json.dumps({**json.loads(model_json.read_text()), **REMOVED_OFF}))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["model"] |= REMOVED_OFF
    saved["train"]["bigram_lr"] = None
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    state["model_config"] |= REMOVED_OFF
    torch.save(state, run / "trainer_state.pt")

    assert generate(greedy) == 0 and capsys.readouterr().out == before
    assert export(["--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    result = train(load_run_config(run / "config.yaml", ["train.max_steps=2"]), resume=True, progress=False)
    assert result.step == 2

    # One that had the table on is refused by every command, in one line.
    model_json.write_text(json.dumps({**json.loads(model_json.read_text()), "bigram_buckets": 64}))
    capsys.readouterr()
    assert generate(greedy) == 2
    err = capsys.readouterr().err
    assert "model.bigram_buckets was removed" in err and "docs/records.md" in err and err.count("\n") == 1


@pytest.fixture
def parent(parent_run, tmp_path) -> Path:  # a copy of the parent run, whose weights the test may change
    return Path(shutil.copytree(parent_run, tmp_path / "parent"))


def _post_training(kind: str, make_config, parent: Path, tmp_path: Path, max_steps: int):
    common = dict(eval={"interval": 0, "sample_tokens": 0, "final_max_batches": 1}, run={"checkpoint_interval": 1})
    train_section = {"init_from": str(parent), "max_steps": max_steps, "batch_size": 2, "warmup_steps": 0}
    if kind.startswith("dpo"):
        pairs = tmp_path / "pairs.jsonl"
        if not pairs.exists():
            preference_file(pairs, count=20)
        lora = {"lora": {"rank": 2}} if kind == "dpo-lora" else {}
        return make_config(tmp_path / "run", data={"format": "preference", "files": {"paths": [str(pairs)]}},
                           train={**train_section, **lora}, **common)
    beta = 0.0 if kind == "rl-no-kl" else 0.1
    return make_config(tmp_path / "run", data={"format": "rl"}, train=train_section,
                       rl={"group_size": 2, "max_new_tokens": 2, "eval_samples": 2, "beta": beta,
                           "arithmetic": {"train_problems": 20, "val_problems": 4, "max_operand": 9}}, **common)


def _change_weights(run: Path) -> None:
    model = load_pretrained(run)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    save_pretrained(model, run)


@pytest.mark.parametrize("kind, put_back", [("dpo", False), ("rl-kl", False), ("dpo", True), ("rl-kl", True),
                                            ("dpo-lora", False), ("rl-no-kl", False)])
def test_a_run_whose_reference_changed_is_refused_on_resume_unless_put_back_or_not_the_parents_file(
        kind, put_back, make_config, parent, tmp_path):
    train(_post_training(kind, make_config, parent, tmp_path, 1), progress=False)
    record = json.loads((tmp_path / "run" / "parent.json").read_text())
    original = (parent / "model.safetensors").read_bytes()
    assert record["weights_sha256"] == hashlib.sha256(original).hexdigest()
    before = _snapshot(tmp_path / "run")
    _change_weights(parent)
    if put_back:
        (parent / "model.safetensors").write_bytes(original)
    resumed = _post_training(kind, make_config, parent, tmp_path, 2)
    if put_back or kind in ("dpo-lora", "rl-no-kl"):
        assert train(resumed, resume=True, progress=False).step == 2
        assert load_trainer_state(tmp_path / "run")["step"] == 2
        return
    with pytest.raises(InitFromError) as error:
        train(resumed, resume=True, progress=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot resume {tmp_path / 'run'}: its reference, "
                                                      f"{parent / 'model.safetensors'} (train.init_from), changed")
    assert "put the parent's weights back to resume" in message
    assert _snapshot(tmp_path / "run") == before  # nothing written, nothing lost
