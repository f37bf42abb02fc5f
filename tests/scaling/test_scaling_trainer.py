"""The trainer with wandb and torchrun on a shrunk configs/small.yaml (W&B read back: wandb_records.py), and
small.yaml's GPU path (bf16 autocast, torch.compile, its options) for a few steps of a shrunk model on the
CPU, so that a change breaking the GPU config fails here first."""

import json
import math
import os
import shutil
import subprocess

import pytest
import torch

from launch_testkit import ROOT, torchrun
from model.gpt import GPT
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from rundir.files import METRICS_FILE
from rundir.metrics import read_metrics
from tests.tracking.wandb_records import read_offline_runs
from training.config import config_to_dict, load_run_config
from training.trainer import train

TRAIN_METRICS = ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu")


# configs/small.yaml as shipped


def test_small_config_is_minimind2_small_sized():
    config = load_run_config(ROOT / "configs" / "small.yaml", [])
    assert (config.data.source, config.data.hub.name) == ("hub", "roneneldan/TinyStories")
    assert (config.train.precision, config.train.compile) == ("bf16", True)
    m = config.model
    assert (m.n_embd, m.n_layer, m.n_head, m.n_kv_head, m.vocab_size) == (512, 8, 8, 2, 6400)
    with torch.device("meta"):  # count parameters without allocating them
        params = GPT(m).num_params()
    # MiniMind2-small's size is the trunk's; the value-embedding tables (one per table layer, a
    # key/value width per token) are lookups on top of it.
    assert m.value_embeddings and tuple(m.value_embedding_layers) == (1, 3, 5, 7)
    tables = len(m.value_embedding_layers) * m.vocab_size * m.n_kv_head * m.head_dim
    assert 24e6 < params - tables < 28e6


@pytest.mark.e2e
@pytest.mark.skipif(not any(shutil.which(c) for c in ("c++", "g++", "clang++")), reason="torch.compile needs a C++ compiler")
def test_small_yaml_trains_compiled_in_bf16_on_the_cpu(small_config, capsys):
    config = small_config("train.precision=bf16", "train.compile=true", "train.max_steps=3", "eval.interval=0",
                          "eval.sample_tokens=0", "logging.wandb.mode=disabled")
    assert config.model.value_embeddings and config.train.optimizer == "adamw" and config.train.grad_accum_steps == 2
    result = train(config, progress=True)
    out = capsys.readouterr().out
    assert "(bf16, compiled)" in out and "memory per device: about" in out
    assert result.step == 3 and math.isfinite(result.val_loss) and math.isfinite(result.last_loss)
    assert load_trainer_state(result.run_dir)["step"] == 3
    assert load_pretrained(result.run_dir).config.value_embeddings  # the saved model loads


# wandb through the trainer


def test_wandb_receives_metrics_samples_summary_and_a_resume_continues_the_run(small_config, tmp_path, monkeypatch):
    """configs/small.yaml on local files: 2 steps, then --resume to 4 steps, logging offline."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    first_result = train(small_config("logging.wandb.mode=offline", "train.max_steps=2"), progress=False)
    config = small_config("logging.wandb.mode=offline")
    result = train(config, resume=True, progress=False)
    assert (first_result.step, result.step, result.stopped_by) == (2, 4, "max_steps")
    for name in ("model.safetensors", "model_config.json", "trainer_state.pt", "metrics.jsonl", "tokenizer.json"):
        assert (run_dir / name).is_file(), name

    # The resumed process continued the same wandb run: same id, the chart picks up at step 3.
    first, second = read_offline_runs(run_dir / "wandb")
    assert first.run_id == second.run_id
    assert torch.load(run_dir / "trainer_state.pt", weights_only=True)["wandb_run_id"] == first.run_id
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert [s for s, _ in first.series("train/loss")] == [1, 2]
    assert [s for s, _ in second.series("train/loss")] == [3, 4]

    # The run's config is the resolved config.
    assert {k: v for k, v in second.config.items() if k != "_wandb"} == json.loads(json.dumps(config_to_dict(config)))

    # Every line of metrics.jsonl reached wandb with the same values at the same step.
    lines = read_metrics(run_dir / METRICS_FILE)
    train_lines = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train_lines] == [1, 2, 3, 4]
    for key in TRAIN_METRICS:
        logged = first.series(f"train/{key}") + second.series(f"train/{key}")
        assert logged == [(r["step"], pytest.approx(r[key])) for r in train_lines], key
    assert second.series("train/tokens")[-1] == (4, 4 * 4 * 2 * 32)  # steps x batch x accum x block

    evals = {r["step"]: r for r in lines if r["kind"] == "eval"}
    for key in ("loss", "bpb"):
        logged = first.series(f"val/{key}") + second.series(f"val/{key}")
        assert logged == [(s, pytest.approx(evals[s][f"val_{key}"])) for s in (2, 4)]
    assert second.series("final/bpb") == [(4, pytest.approx(result.val_bpb))]

    # A samples table at each evaluation, holding the sample metrics.jsonl recorded.
    tables = first.series("samples") + second.series("samples")
    assert [s for s, _ in tables] == [2, 4]
    first_table = first.table(tables[0][1])
    assert first_table == {"columns": ["prompt", "completion"], "data": [[config.eval.sample_prompt, evals[2]["sample"]]]}
    [[prompt, completion]] = second.table(tables[1][1])["data"]
    assert prompt == config.eval.sample_prompt and completion

    # The attention probe's numbers at every evaluation, to wandb and metrics.jsonl (this corpus is too
    # small for the induction probe: tests/analysis/test_roles.py), and a figure of the maps at the
    # first evaluation of each process and at its final one.
    layer = f"attn_entropy_layer{config.model.n_layer - 1}"
    logged = first.series(f"attn/{layer}") + second.series(f"attn/{layer}")
    assert logged == [(s, pytest.approx(evals[s][layer])) for s in (2, 4)]
    maps = first.series("attn/maps") + second.series("attn/maps")
    assert [s for s, _ in maps] == [2, 4]
    for run, (_, image) in zip((first, second), maps):
        assert (run.directory / "files" / image["path"]).read_bytes()[:4] == b"\x89PNG"

    # The final numbers are in the summary.
    assert second.summary["val_loss"] == pytest.approx(result.val_loss)
    assert second.summary["val_bpb"] == pytest.approx(result.val_bpb)
    assert second.summary["step"] == 4 and second.summary["stopped_by"] == "max_steps"


def test_wandb_failing_to_start_does_not_stop_training(small_config, tmp_path, monkeypatch, capsys):
    import wandb

    def refuse(*args, **kwargs):
        raise wandb.errors.CommError("could not reach the server")

    monkeypatch.setattr(wandb, "init", refuse)
    result = train(small_config("logging.wandb.mode=offline", "train.max_steps=2", "eval.interval=0"), progress=False)
    assert result.step == 2 and result.val_loss is not None
    run_dir = tmp_path / "run"
    assert (run_dir / "trainer_state.pt").is_file() and (run_dir / "metrics.jsonl").is_file()
    assert torch.load(run_dir / "trainer_state.pt", weights_only=True)["wandb_run_id"] is None
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("wandb:")]
    assert err == ["wandb: could not start (CommError: could not reach the server); training continues without wandb"]


# torchrun


@pytest.mark.e2e  # two processes over a whole config: the default suite keeps the two-rank step tests
@pytest.mark.distributed
def test_torchrun_two_processes_train_and_only_rank0_writes(small_overrides, tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "WANDB_API_KEY")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HOME=str(tmp_path / "home"))
    cmd = torchrun(2, ["train.py", "--config", "configs/small.yaml", "--no-progress",
                       *[arg for o in small_overrides for arg in ("--set", o)], "--set", f"run.out_dir={run_dir}",
                       "--set", "logging.wandb.mode=offline", "--set", "eval.interval=0"])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("done: 4 steps") == 1  # rank 0 reports; rank 1 stays quiet

    # One checkpoint, one metrics file, one wandb run: all from rank 0.
    assert sorted(p.name for p in run_dir.glob("trainer_state*")) == ["trainer_state.pt"]
    lines = read_metrics(run_dir / METRICS_FILE)
    assert [r["step"] for r in lines if r["kind"] == "train"] == [1, 2, 3, 4]
    assert [r["kind"] for r in lines if r["kind"] != "train"] == ["final_eval"]
    [run] = read_offline_runs(run_dir / "wandb")
    assert [s for s, _ in run.series("train/loss")] == [1, 2, 3, 4]

    # The global batch stayed 4 x 2 sequences: each rank ran one micro-batch per step.
    assert lines[-2]["tokens"] == 4 * 4 * 2 * 32
    state = torch.load(run_dir / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
    # Every rank drew its own batches: their sampler states differ.
    g0, g1 = (r["batches"]["generator_state"] for r in state["ranks"])
    assert not torch.equal(g0, g1)
