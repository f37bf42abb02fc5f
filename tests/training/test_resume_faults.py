"""--resume with settings the checkpoint depends on, with a damaged trainer state or a damaged
metrics.jsonl: one clear error naming the key or file, or a resume that keeps the good lines."""

import json
from pathlib import Path

import pytest
import torch
import yaml

import training.trainer as trainer_module
from common.errors import UserError
from exporting.cli import main as export
from inference.cli import main as generate
from rundir.checkpoint import CheckpointError
from rundir.metrics import read_metrics
from training.config import load_run_config
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
