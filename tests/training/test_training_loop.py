"""The training loop end to end in-process: learning, accumulation, checkpoints, resume, failures; and the
default sample prompt, from the run's data: a speaker for the plays, the held-out text's first words for
any other corpus."""

import os
import signal

import pytest
import torch

import rundir.checkpoint as checkpoint_module
import training.tasks.text as tasks_module
import training.trainer as trainer_module
from common.errors import UserError
from data.batches.text import TrainBatches
from data.prepared.text import prepare_data
from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.checkpoint import CheckpointError, load_trainer_state
from rundir.files import STATE_FILE
from rundir.metrics import read_metrics
from run_testkit import build_model, chat_tokenizer
from training.attention_probe import attention_probe
from training.config import load_run_config
from training.tasks.task import accumulate_gradients
from training.tasks.text import NEUTRAL_PROMPT, SHAKESPEARE_PROMPT, default_sample_prompt
from training.trainer import NonFiniteLossError, train

# Fields of metrics.jsonl that depend only on the computation (not on timing).
DETERMINISTIC = ("kind", "step", "loss", "lr", "grad_norm", "tokens", "val_loss", "val_bpb", "val_tokens", "sample")


def deterministic(records):
    return [{k: r[k] for k in DETERMINISTIC if k in r} for r in records]


def max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def interrupt_at(monkeypatch, step: int, signum: int = signal.SIGTERM) -> None:
    """Deliver a real signal to this process while optimizer step ``step`` is running."""
    original = tasks_module.accumulate_gradients

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        wrapped.calls += 1
        if wrapped.calls == step:
            os.kill(os.getpid(), signum)
        return result

    wrapped.calls = 0
    monkeypatch.setattr(tasks_module, "accumulate_gradients", wrapped)


def test_loss_decreases_and_the_run_dir_describes_itself(make_config, tmp_path):
    cfg = make_config(train={"max_steps": 40}, eval={"interval": 20})
    result = train(cfg, progress=False)
    assert result.stopped_by == "max_steps" and result.step == 40
    run = tmp_path / "run"
    for name in ("config.yaml", "tokenizer.json", "model_config.json", "model.safetensors", STATE_FILE, "metrics.jsonl"):
        assert (run / name).is_file(), name
    records = read_metrics(run / "metrics.jsonl")
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 41))
    assert losses[-1] < losses[0] - 1.0, losses
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40]
    # The sample continues a prompt from the run's own held-out text (training/tasks/text.py).
    assert result.sample_prompt and evals[0]["sample"].startswith(result.sample_prompt)
    final = [r for r in records if r["kind"] == "final_eval"]
    assert len(final) == 1 and final[0]["val_loss"] == pytest.approx(result.val_loss)
    assert result.val_loss < evals[0]["val_loss"] + 0.5 and 0 < result.val_bpb < 8
    # The saved config is the one trained with; the weights load for generation.
    assert load_run_config(run / "config.yaml") == cfg
    state = load_trainer_state(run)
    assert max_weight_diff(load_pretrained(run).state_dict(), state["model"]) == 0.0
    assert state["step"] == 40 and state["tokens_seen"] == 40 * 8 * 32 == result.tokens_seen


def test_grad_accumulation_equals_one_larger_batch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=12, n_layer=2, n_head=2, n_kv_head=1, n_embd=32))
    x, y = torch.randint(0, 50, (12, 12)), torch.randint(0, 50, (12, 12))
    chunks = iter(list(zip(x.chunk(4), y.chunk(4))))
    loss_accum = accumulate_gradients(model, lambda: next(chunks), 4)
    grads_accum = [p.grad.clone() for p in model.parameters()]
    micro_losses = [model(xc, yc)[1].item() for xc, yc in zip(x.chunk(4), y.chunk(4))]
    model.zero_grad(set_to_none=True)
    loss_big = accumulate_gradients(model, lambda: (x, y), 1)
    for a, b in zip(grads_accum, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # The returned loss is the mean of the micro-batch losses (= the big batch's loss here).
    assert loss_accum.item() == pytest.approx(sum(micro_losses) / 4, rel=1e-6)
    assert loss_accum.item() == pytest.approx(loss_big.item(), rel=1e-5)


@pytest.mark.parametrize("grad_clip", [0.01, 0.0])
def test_the_step_logs_the_mean_loss_of_its_micro_batches_and_applies_the_clipped_gradient(make_config, tmp_path,
                                                                                           grad_clip):
    cfg = make_config(train={"max_steps": 1, "grad_accum_steps": 3, "grad_clip": grad_clip},
                      eval={"interval": 0, "sample_tokens": 0})
    train(cfg, progress=False)
    logged = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert logged["kind"] == "train" and logged["step"] == 1
    # Rebuild step 1's loss by hand: the same initial weights and the same three micro-batches.
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model)
    tokens = prepare_data(cfg.data, progress=False).train_tokens()
    batches = TrainBatches(tokens, cfg.model.block_size, cfg.train.batch_size, seed=cfg.train.seed)
    with torch.no_grad():
        losses = [model(*batches.next())[1].item() for _ in range(3)]
    assert len(set(losses)) == 3  # three different micro-batches
    assert logged["loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    assert logged["tokens"] == 3 * cfg.train.batch_size * cfg.model.block_size
    # AdamW's first update hardly depends on the gradient's scale, so read the clip from its state:
    # after one step the first moment is (1 - beta1) times the gradient the optimizer was given,
    # whose norm is the logged (unclipped) norm, or train.grad_clip when that is smaller.
    moments = [s["exp_avg"] for s in load_trainer_state(tmp_path / "run")["optimizer"]["state"].values()]
    given = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in moments])).item()
    assert logged["grad_norm"] > 0.01  # the norm at initialisation, so the small clip binds
    expected = min(logged["grad_norm"], grad_clip) if grad_clip > 0 else logged["grad_norm"]
    assert given / (1 - cfg.train.beta1) == pytest.approx(expected, rel=1e-4)


def test_a_step_abandoned_between_micro_batches_is_taken_whole_on_resume(make_config, tmp_path, monkeypatch):
    # A signal between micro-batches abandons the step: the batch and dropout draws it made are
    # put back, so the resumed run takes that step whole and ends where an uninterrupted one does.
    sections = dict(model={"dropout": 0.1}, train={"max_steps": 4, "grad_accum_steps": 3}, eval={"interval": 0})
    expected = train(make_config(tmp_path / "straight", **sections), progress=False)
    original, calls = tasks_module.accumulate_gradients, []

    def signal_after_one_micro_batch(*args, should_stop, **kwargs):
        calls.append(1)
        if len(calls) != 3:
            return original(*args, should_stop=should_stop, **kwargs)

        def stop_now() -> bool:
            os.kill(os.getpid(), signal.SIGTERM)
            return should_stop()
        return original(*args, should_stop=stop_now, **kwargs)

    monkeypatch.setattr(tasks_module, "accumulate_gradients", signal_after_one_micro_batch)
    broken = make_config(tmp_path / "broken", **sections)
    stopped = train(broken, progress=False)
    monkeypatch.undo()
    assert stopped.interrupted and stopped.step == 2 and load_trainer_state(tmp_path / "broken")["step"] == 2
    resumed = train(broken, resume=True, progress=False)
    assert resumed.step == 4 and resumed.last_loss == expected.last_loss
    a, b = load_pretrained(tmp_path / "straight").state_dict(), load_pretrained(tmp_path / "broken").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# The options case trains with value embeddings and an untied head: the saved config keeps them on resume.
OPTIONS = dict(value_embeddings=True, tie_embeddings=False)


@pytest.mark.parametrize("optimizer, sampling, model, precision", [
    ("adamw", "random", {}, "fp32"), ("muon", "random", {}, "fp32"), ("muon", "epoch", {}, "fp32"),
    ("muon", "epoch", OPTIONS, "fp32"), ("muon", "random", {}, "bf16")])
def test_resume_equals_an_uninterrupted_run(make_config, tmp_path, monkeypatch, optimizer, sampling, model, precision):
    sections = dict(model=model, eval={"interval": 5}, run={"checkpoint_interval": 4},
                    train={"max_steps": 16, "grad_accum_steps": 2, "optimizer": optimizer, "sampling": sampling,
                           "precision": precision})
    expected = train(make_config(tmp_path / "straight", **sections), progress=False)
    broken = make_config(tmp_path / "broken", **sections)
    interrupt_at(monkeypatch, 7)
    stopped = train(broken, progress=False)
    monkeypatch.undo()
    assert stopped.interrupted and stopped.step == 7 and stopped.signal == signal.SIGTERM
    assert load_trainer_state(tmp_path / "broken")["step"] == 7 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    resumed = train(broken, resume=True, progress=False)
    assert resumed.step == 16 and resumed.stopped_by == "max_steps"
    a, b = load_trainer_state(tmp_path / "straight"), load_trainer_state(tmp_path / "broken")
    assert max_weight_diff(a["model"], b["model"]) == 0.0 and b["precision"] == precision
    assert resumed.val_loss == pytest.approx(expected.val_loss, abs=1e-6)
    assert deterministic(read_metrics(tmp_path / "broken" / "metrics.jsonl")) == deterministic(
        read_metrics(tmp_path / "straight" / "metrics.jsonl"))


def test_a_checkpoint_interrupted_mid_write_leaves_the_previous_one(make_config, tmp_path, monkeypatch):
    cfg = make_config(train={"max_steps": 8}, eval={"interval": 0}, run={"checkpoint_interval": 4})
    real_save = torch.save
    calls = {"n": 0}

    def half_then_die(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the step-8 trainer state
            f.write(b"PK\x03\x04 half a zip file")  # save_checkpoint hands torch.save an open file
            raise OSError("disk pulled out mid-write")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", half_then_die)
    with pytest.raises(OSError, match="mid-write"):
        train(cfg, progress=False)
    monkeypatch.undo()
    run = tmp_path / "run"
    assert load_trainer_state(run)["step"] == 4
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind
    assert train(cfg, resume=True, progress=False).step == 8
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"] == list(range(1, 9))


def _nan_loss_at(monkeypatch, step: int) -> None:
    real_forward, calls = GPT.forward, []

    def poisoned(self, idx, targets=None, cache=None):
        out = real_forward(self, idx, targets, cache)
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) == step:
                return out[0], out[1] * float("nan")
        return out

    monkeypatch.setattr(GPT, "forward", poisoned)


def _inf_gradient_at(monkeypatch, step: int) -> None:
    # A gradient can overflow while the loss stays finite: the norm is checked as well as the loss.
    real_clip, norms = trainer_module.clip_gradients, []

    def overflowing(model, max_norm):
        norms.append(real_clip(model, max_norm))
        return norms[-1] * float("inf") if len(norms) == step else norms[-1]

    monkeypatch.setattr(trainer_module, "clip_gradients", overflowing)


@pytest.mark.parametrize("diverge, said", [(_nan_loss_at, r"loss nan, gradient norm "),
                                           (_inf_gradient_at, r"loss \d[^,]*, gradient norm inf")], ids=["nan-loss", "inf-gradient"])
def test_a_diverged_step_stops_the_run_and_keeps_the_last_checkpoint(make_config, tmp_path, monkeypatch, diverge, said):
    cfg = make_config(train={"max_steps": 10}, eval={"interval": 0}, run={"checkpoint_interval": 3})
    diverge(monkeypatch, 5)  # step 5: after the step-3 checkpoint
    with pytest.raises(NonFiniteLossError, match=rf"^training diverged at step 5: {said}.*step 3") as info:
        train(cfg, progress=False)
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)
    run = tmp_path / "run"
    state = load_trainer_state(run)
    assert state["step"] == 3 and all(torch.isfinite(t).all() for t in state["model"].values())
    assert all(torch.isfinite(t).all() for t in load_pretrained(run).state_dict().values())
    metrics = run / "metrics.jsonl"
    assert max(r["step"] for r in read_metrics(metrics)) == 4

    # Resuming drops the lines logged after the checkpoint (and a torn last line), then appends.
    with open(metrics, "a") as f:
        f.write('{"kind": "train", "st')
    monkeypatch.undo()
    assert train(cfg, resume=True, progress=False).step == 10
    assert [(r["kind"], r["step"]) for r in read_metrics(metrics)] == [("train", s) for s in range(1, 11)] + [
        ("final_eval", 10)]


def test_time_and_token_budgets_end_the_run(make_config):
    cfg = make_config(train={"max_steps": None, "max_minutes": 0.02, "warmup_steps": 0}, eval={"interval": 0})
    result = train(cfg, progress=False)
    assert result.stopped_by == "max_minutes" and result.step >= 1 and result.val_loss is not None
    last = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["kind"] == "train"][-1]
    assert last["lr"] < 0.5 * cfg.train.lr  # annealed by the clock
    cfg = make_config(cfg.out_dir.parent / "tokens", train={"max_steps": 100, "max_tokens": 5 * 8 * 32},
                      eval={"interval": 0})
    result = train(cfg, progress=False)
    assert result.stopped_by == "max_tokens" and result.step == 5


@pytest.mark.parametrize("max_minutes", [None, 5.0])
def test_progress_bar_trusts_the_clock_budget_over_tqdms_estimate(make_config, capsys, max_minutes):
    # Under a clock budget most of max_steps never runs, so tqdm's step-based "<remaining" would
    # overstate the time left; the postfix's "left" (the sooner of both budgets) stays.
    cfg = make_config(train={"max_steps": 3, "max_minutes": max_minutes}, eval={"interval": 0})
    train(cfg, progress=True)
    # A clock budget is drawn as time, its total steady (the steps it allows move with the pace).
    bars = [line for line in capsys.readouterr().err.split("\r") if line.startswith("train:")]
    assert "left " in bars[-1] and ("<" in bars[-1]) == (max_minutes is None)
    if max_minutes is None:
        assert "3/3" in bars[-1]
    else:
        assert "100%" in bars[-1] and "300/300 s, step 3 | loss" in bars[-1] and all("/300 s" in bar for bar in bars), bars


def test_a_run_dir_holding_a_run_is_refused_resumed_in_its_own_thread_count_or_overwritten(make_config, tmp_path):
    train(make_config(train={"max_steps": 2}, eval={"interval": 0}), progress=False)  # one thread (conftest)
    longer = make_config(train={"max_steps": 3}, eval={"interval": 0})
    with pytest.raises(CheckpointError, match="already holds a run.*--resume.*--overwrite"):
        train(longer, progress=False)
    assert load_trainer_state(tmp_path / "run")["step"] == 2  # untouched by the refusal
    # The thread count changes the last bits of every step; a resume under auto takes the checkpoint's,
    # whatever the machine (or OMP_NUM_THREADS) says now, so it stays exact.
    os.environ["OMP_NUM_THREADS"] = "2"
    torch.set_num_threads(2)
    try:
        train(longer, resume=True, progress=False)
        assert torch.get_num_threads() == 1
    finally:
        os.environ["OMP_NUM_THREADS"] = "1"
    assert train(longer, overwrite=True, progress=False).step == 3
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]


def test_the_attention_probe_logs_every_evaluation_and_draws_the_maps_at_every_fourth_and_the_final():
    class Logger:  # what the probe sends a logger (WandbLogger's real figures: tests/scaling)
        active, logged, images = True, [], []

        def log(self, metrics, step):
            self.logged.append((step, metrics))

        def log_attention_maps(self, key, maps, tokens, title, step):
            self.images.append((key, step, len(maps), len(tokens)))

    tokenizer, logger = chat_tokenizer(), Logger()
    model = build_model(tokenizer.get_vocab_size(), 32)
    val = torch.randint(7, 40, (600,), generator=torch.Generator().manual_seed(0)).numpy()  # ids seen 10+ times
    probe = attention_probe(val, tokenizer, "ROMEO: O", block_size=32, skip_id=0, device=torch.device("cpu"))
    steps = [(1, False), (2, False), (3, False), (4, False), (5, False), (6, False), (6, True)]
    stats = [probe.record(model, logger, step, tokenizer, final=final, image_interval=4) for step, final in steps]
    assert logger.logged == [(step, {f"attn/{k}": v for k, v in s.items()}) for (step, _), s in zip(steps, stats)]
    assert "induction_best" in stats[0] and "attn_entropy_layer1" in stats[0]
    assert logger.images == [("attn/maps", step, 2, len(probe.prompt_ids)) for step in (1, 5, 6)]


def test_a_resume_takes_the_rates_and_muons_momentum_from_the_config(make_config, tmp_path):
    # A checkpoint's optimizer groups carry the rates they were built with; a resume runs at the
    # config's, as for train.lr. The tables' group exists whether or not its rate is set.
    sections = dict(model={"value_embeddings": True}, eval={"interval": 0}, run={"checkpoint_interval": 0})
    muon = {"optimizer": "muon", "muon_momentum": 0.95}
    train(make_config(tmp_path / "run", train={"max_steps": 3, "muon_lr": 0.02, **muon}, **sections), progress=False)
    optimizer = lambda: load_trainer_state(tmp_path / "run")["optimizer"]  # noqa: E731
    assert optimizer()["muon"]["param_groups"][0]["momentum"] == pytest.approx(0.95)
    changed = make_config(tmp_path / "run", train={"max_steps": 6, "muon_lr": 0.06, "value_embedding_lr": 0.05,
                                                   **muon, "muon_momentum": 0.9}, **sections)
    train(changed, resume=True, progress=False)
    muon_group, groups = optimizer()["muon"]["param_groups"][0], optimizer()["adamw"]["param_groups"]
    assert muon_group["momentum"] == pytest.approx(0.90)
    assert [len(g["params"]) for g in groups] == [len(groups[0]["params"]), 1]  # the one table (2 layers)
    assert groups[0]["lr"] > 0 and muon_group["lr"] / groups[0]["lr"] == pytest.approx(0.06 / changed.train.lr)
    assert groups[1]["lr"] / groups[0]["lr"] == pytest.approx(0.05 / changed.train.lr)


def test_the_sample_prompt_keeps_a_speaker_for_the_plays_and_begins_other_corpora_as_their_held_out_text():
    tokenizer = chat_tokenizer()
    val = tokenizer.encode("\n\n  Once upon a time, there was a fox.\nIt ran.", add_special_tokens=False).ids
    assert tokenizer.decode(val).startswith("\n\n  Once")
    assert default_sample_prompt("files", tokenizer, val) == "Once upon a"
    assert default_sample_prompt("hub", tokenizer, val) == "Once upon a"
    assert default_sample_prompt("shakespeare", tokenizer, val) == SHAKESPEARE_PROMPT
    # Held-out text without words gets a neutral prompt.
    blank = tokenizer.encode("\n \n\t", add_special_tokens=False).ids
    assert default_sample_prompt("files", tokenizer, blank) == default_sample_prompt("files", tokenizer, []) == NEUTRAL_PROMPT
