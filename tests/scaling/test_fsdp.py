"""train.parallel=fsdp: the torch floor, activation checkpointing, and under torchrun (e2e) Muon on
sharded weights, DDP's losses, resumes at another world size, and a kill -9 inside a save."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from common.config import ConfigError, build
from launch_testkit import ROOT, every_rank_says_one_line, launch, ok, torchrun, torchrun_env, train_args
from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.checkpoint import CheckpointError, load_trainer_state
from rundir.files import METRICS_FILE, STATE_FILE
from rundir.lock import hold_run_dir
from rundir.metrics import read_metrics
from training.config import TrainConfig
from training.distributed import DistContext
from training.adapters import Adapters
from training.fsdp import ShardedCheckpointer
from training.fsdp import torch_too_old
from training.optim import build_optimizer, plan_param_groups
from training.recompute import checkpoint_blocks
from training.resume_rules import check_fixed_settings, fixed_settings

MLA = ["model.attention=mla", "model.n_kv_head=4", "model.kv_latent_dim=32", "model.value_embeddings=false"]


def test_fsdp_torch_floor_and_bad_values_are_refused_in_one_line(monkeypatch):
    assert torch_too_old("2.7.0") is None and torch_too_old("2.13.0+cpu") is None
    message = torch_too_old("2.6.0+cu124")
    assert "torch >= 2.7 (this is 2.6.0+cu124)" in message and "pip install -U" in message
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    with pytest.raises(ConfigError, match="needs torch >= 2.7") as info:
        build(TrainConfig, {"max_steps": 1, "parallel": "fsdp"}, "train")
    assert "\n" not in str(info.value)
    TrainConfig(max_steps=1, parallel="ddp")  # DDP has no such floor


# Dropout on: the recomputation must draw the same dropout masks as the forward did.
@pytest.mark.parametrize("extra", [dict(n_kv_head=2, dropout=0.1),
                                   dict(attention="mla", n_kv_head=4, kv_latent_dim=16, value_embeddings=False)])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(extra):
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, **extra)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        if recompute:
            checkpoint_blocks(model)
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (plain_loss, plain), (loss, grads) = results
    assert torch.equal(loss, plain_loss)
    for name, grad in plain.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-7)  # fp32, the same ops again


# Two gloo processes (e2e)


def _losses(run: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(run / METRICS_FILE)]


def _sharded_weights(run: Path) -> dict[str, torch.Tensor]:
    """The weights in the run's sharded checkpoint, loaded whole by this (single) process."""
    config = load_pretrained(run).config
    model = GPT(config)
    muon = TrainConfig(max_steps=1, optimizer="muon")
    optimizer = build_optimizer(plan_param_groups(model, muon), muon, torch.device("cpu"))
    checkpointer = ShardedCheckpointer(run, DistContext(), config, torch.device("cpu"), Adapters())
    checkpointer.restore(load_trainer_state(run), model, optimizer)
    return model.state_dict()


@pytest.mark.e2e
@pytest.mark.distributed
def test_muon_on_sharded_weights_equals_single_process_muon(tmp_path):
    out = tmp_path / "result.json"
    ok(launch(2, [str(ROOT / "tests" / "scaling" / "fsdp_muon_worker.py"), str(out)]))
    result = json.loads(out.read_text())
    for attention in ("gqa", "mla"):
        # 3 steps of Muon + AdamW moved weights by a few hundredths; sharding changes only the
        # order of fp32 sums, so the weights agree to float rounding.
        assert result[attention]["max_change"] > 1e-2
        assert result[attention]["max_diff"] < 1e-6


@pytest.mark.e2e
@pytest.mark.distributed
@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_fsdp_losses_equal_ddp_then_resume_at_one_process_and_generate(attention, small_overrides, tmp_path):
    # 2 micro-steps a process; with MLA, both modes also recompute each block in the backward pass.
    more = ["train.grad_accum_steps=4"] + (MLA + ["train.activation_checkpointing=true"] if attention == "mla" else [])
    runs = {}
    for parallel in ("ddp", "fsdp"):
        runs[parallel] = tmp_path / parallel
        ok(launch(2, train_args(small_overrides, runs[parallel], f"train.parallel={parallel}", *more)))
    ddp, fsdp = _losses(runs["ddp"]), _losses(runs["fsdp"])
    assert [(k, s) for k, s, _ in fsdp] == [(k, s) for k, s, _ in ddp] and len(fsdp) >= 6
    for (_, _, want), (_, _, got) in zip(ddp, fsdp):
        assert got == pytest.approx(want, rel=1e-5)  # fp32: only the order of sums differs

    # The consolidated model.safetensors holds the sharded checkpoint's weights.
    run = runs["fsdp"]
    saved, sharded = load_pretrained(run).state_dict(), _sharded_weights(run)
    assert all(torch.equal(saved[k], sharded[k]) for k in saved)
    assert sorted(p.name for p in run.glob("sharded-step*")) == ["sharded-step00000004"]

    # 2 -> 1 process: resumed by plain python, which saves a sharded checkpoint of its own; 1 -> 2 processes:
    # resumed under torchrun again; then generate.py decodes from the result.
    resumed = ok(launch(1, [*train_args(small_overrides, run, "train.parallel=fsdp", "train.max_steps=6", *more),
                            "--resume"]))
    assert "saved with 2 process(es) on 1" in resumed.stdout and "done: 6 steps" in resumed.stdout
    state = load_trainer_state(run)
    assert state["world_size"] == 1 and state["sharded"] == "sharded-step00000006"
    resumed = ok(launch(2, [*train_args(small_overrides, run, "train.parallel=fsdp", "train.max_steps=8", *more),
                            "--resume"]))
    assert "done: 8 steps" in resumed.stdout and load_trainer_state(run)["world_size"] == 2
    assert [s for k, s, _ in _losses(run) if k == "train"] == list(range(1, 9))
    generated = ok(launch(1, ["generate.py", "--run", str(run), "--prompt", "Once upon a time",
                              "--max-new-tokens", "12", "--seed", "0"], timeout=120))
    assert generated.stdout.startswith("Once upon a time") and len(generated.stdout) > len("Once upon a time")


@pytest.mark.e2e
@pytest.mark.distributed
def test_kill_9_in_a_sharded_save_leaves_the_previous_checkpoint_loadable(small_overrides, tmp_path):
    run = tmp_path / "run"
    worker = str(ROOT / "tests" / "scaling" / "fsdp_kill_worker.py")
    # Checkpoints at steps 2 and 4: the kill lands in the second save, shards written, not published.
    # No periodic evaluation, so model.safetensors is each checkpoint's weights, not an evaluation's.
    args = train_args(small_overrides, run, "train.parallel=fsdp", "eval.interval=0")
    killed = launch(2, [worker, "2", *args[1:]])
    assert killed.returncode != 0 and f"Signal {signal.SIGKILL.value}" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    state = load_trainer_state(run)
    assert state["step"] == 2 and state["sharded"] == "sharded-step00000002"
    assert (run / "sharded-step00000004.partial").is_dir()  # the unpublished save, never read
    weights = _sharded_weights(run)
    assert all(torch.equal(weights[k], v) for k, v in load_pretrained(run).state_dict().items())

    # The previous checkpoint resumes; the next save clears the unpublished one.
    proc = ok(launch(2, [*args, "--resume"]))
    assert "done: 4 steps" in proc.stdout
    assert sorted(p.name for p in run.glob("sharded-step*")) == ["sharded-step00000004"]
    # ... and ends where an uninterrupted run does: the sharded optimizer state came back whole.
    whole = tmp_path / "whole"
    ok(launch(2, train_args(small_overrides, whole, "train.parallel=fsdp")))
    expected = load_pretrained(whole).state_dict()
    for name, tensor in load_pretrained(run).state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-5)  # fp32 sums, reordered


def test_resuming_with_another_train_parallel_is_refused_in_one_line(tmp_path):
    state = {"fixed_settings": fixed_settings(TrainConfig(max_steps=1, parallel="ddp"))}
    with pytest.raises(CheckpointError, match="train.parallel is 'fsdp' but the run was trained with 'ddp'"):
        check_fixed_settings(state, TrainConfig(max_steps=1, parallel="fsdp"), tmp_path)


@pytest.mark.e2e
@pytest.mark.distributed
def test_chat_tuning_from_a_parent_run_under_fsdp_equals_ddp(small_overrides, tmp_path):
    parent = tmp_path / "parent"
    ok(launch(1, train_args(small_overrides, parent, "model.block_size=128", "data.source=shakespeare",
                            "train.max_steps=2")))
    cache = next(s for s in small_overrides if s.startswith("data.cache_dir="))
    runs = {}
    for parallel in ("ddp", "fsdp"):
        runs[parallel] = tmp_path / f"chat-{parallel}"
        sets = [f"train.init_from={json.dumps(str(parent))}", cache, "train.max_steps=3", "train.max_minutes=null",
                "train.batch_size=4", "train.device=cpu", "train.peak_flops=1e11", "eval.interval=2",
                "eval.max_batches=2", "eval.final_max_batches=3", "eval.sample_tokens=8", "logging.wandb.mode=disabled",
                f"run.out_dir={json.dumps(str(runs[parallel]))}", f"train.parallel={parallel}"]
        args = ["train.py", "--config", "configs/tiny-chat.yaml", "--no-progress", *[a for s in sets for a in ("--set", s)]]
        assert "of assistant text" in ok(launch(2, args)).stdout
    ddp, fsdp = _losses(runs["ddp"]), _losses(runs["fsdp"])
    assert [(k, s) for k, s, _ in fsdp] == [(k, s) for k, s, _ in ddp] and len(fsdp) >= 3
    for (_, _, want), (_, _, got) in zip(ddp, fsdp):
        assert got == pytest.approx(want, rel=1e-5)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie nobody has reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.e2e
@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds the workers in /proc")
def test_workers_end_when_torchrun_is_killed_and_leave_a_loadable_checkpoint(small_overrides, tmp_path):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    args = train_args(small_overrides, run, "train.parallel=fsdp", "train.max_steps=1000000", "eval.interval=0")
    with log.open("w") as out:
        launcher = subprocess.Popen(torchrun(2, args), cwd=ROOT, env=torchrun_env(), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 300  # generous: only a broken run takes this long
        while not (run / STATE_FILE).is_file():  # the first checkpoint (step 2) is written
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        # The kernel tells each worker that its parent is gone, and it stops as on SIGTERM; the
        # deadline only bounds a test whose workers never end.
        deadline = time.monotonic() + 180
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(_running, workers)), log.read_text()[-3000:]
    finally:
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    state = load_trainer_state(run)
    assert state["step"] >= 2 and state["sharded"] == f"sharded-step{state['step']:08d}"
    weights = _sharded_weights(run)
    assert all(torch.equal(weights[k], v) for k, v in load_pretrained(run).state_dict().items())


@pytest.fixture(scope="module")
def two_rank_run(small_overrides, tmp_path_factory) -> Path:
    """An fsdp run of 2 steps saved by two processes (a shard file each); tests work on copies."""
    run = tmp_path_factory.mktemp("fsdp") / "run"
    ok(launch(2, train_args(small_overrides, run, "train.parallel=fsdp", "train.max_steps=2")))
    return run


def _half_a_shard(folder: Path) -> None:
    shard = folder / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _overwritten_shard(folder: Path) -> None:
    shard = folder / "__1_0.distcp"
    shard.write_bytes(os.urandom(shard.stat().st_size))


DAMAGES = {
    "half a shard": _half_a_shard,
    "a missing shard": lambda folder: (folder / "__1_0.distcp").unlink(),
    "a missing .metadata": lambda folder: (folder / ".metadata").unlink(),
    "a random .metadata": lambda folder: (folder / ".metadata").write_bytes(os.urandom(4096)),
    "a shard overwritten": _overwritten_shard,
    "a missing folder": shutil.rmtree,
}


@pytest.mark.e2e
@pytest.mark.distributed
def test_a_damaged_sharded_checkpoint_is_one_line_naming_it_and_the_run_stays_intact(
        two_rank_run, small_overrides, tmp_path, capsys):
    import train as train_cli

    for name, damage in DAMAGES.items():
        run = tmp_path / name.replace(" ", "-")
        shutil.copytree(two_rank_run, run)
        folder = run / "sharded-step00000002"
        damage(folder)
        before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and not p.name.startswith(".run.lock")}
        code = train_cli.main([*train_args(small_overrides, run, "train.parallel=fsdp")[1:], "--resume"])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (name, err[-3000:])
        assert f"sharded checkpoint {folder} is damaged" in lines[0], name
        assert f"--set train.init_from={run} and another run.out_dir" in lines[0], name
        assert {p: p.read_bytes() for p in before} == before, name  # nothing written or removed

    # Under torchrun every rank fails the same way and says so in the same line.
    run = tmp_path / "half-a-shard"
    line = every_rank_says_one_line(launch(2, [*train_args(small_overrides, run, "train.parallel=fsdp"), "--resume"]))
    assert f"sharded checkpoint {run / 'sharded-step00000002'} is damaged" in line


@pytest.mark.e2e
@pytest.mark.distributed
def test_refusals_of_rank_0_are_every_ranks_one_line(two_rank_run, small_overrides, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_rank_run, run)
    args = train_args(small_overrides, run, "train.parallel=fsdp", "train.max_steps=4")
    line = every_rank_says_one_line(launch(2, args))
    assert f"{run} already holds a run; pass --resume" in line
    with hold_run_dir(run):  # another training holds the directory
        line = every_rank_says_one_line(launch(2, [*args, "--resume"]))
    assert f"{run} is in use by another training (pid {os.getpid()}" in line
    assert load_trainer_state(run)["step"] == 2


def _disk_bytes(folder: Path, block: int = 4096) -> int:
    """What the files under ``folder`` take on a filesystem of ``block``-byte blocks."""
    return sum(-(-p.stat().st_size // block) * block for p in folder.rglob("*") if p.is_file())


@pytest.mark.e2e
@pytest.mark.distributed
def test_a_sharded_save_on_a_full_disk_is_one_line_and_leaves_the_previous_checkpoint(
        two_rank_run, small_overrides, tmp_path, mount_tmpfs):
    # Room for one checkpoint and half of a second sharded folder beside it: the save of step 4
    # runs out of space while its shards are written.
    sharded = _disk_bytes(two_rank_run / "sharded-step00000002")
    disk = mount_tmpfs(_disk_bytes(two_rank_run) + sharded // 2 + 64 * 1024)
    run = disk / "run"
    # No periodic evaluation, so model.safetensors is each checkpoint's weights, not an evaluation's.
    line = every_rank_says_one_line(launch(2, train_args(small_overrides, run, "train.parallel=fsdp",
                                                            "eval.interval=0")))
    # The OSError itself where the failing rank's exception still carries it, else torch's words.
    assert "sharded-step00000004.partial" in line
    assert "No space left on device; the disk is full" in line or "make sure its disk has room" in line
    assert sorted(p.name for p in run.glob("sharded-step*")) == ["sharded-step00000002"]  # the partial one removed
    assert load_trainer_state(run)["step"] == 2
    weights = _sharded_weights(run)
    assert all(torch.equal(weights[k], v) for k, v in load_pretrained(run).state_dict().items())
