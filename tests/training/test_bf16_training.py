"""Training under bf16 autocast on the CPU: which operations run in bf16 and which stay fp32, that
evaluation stays fp32, and that a resume keeps the run's own precision (docs/training.md#precision;
a bf16 run resuming exactly is a row of test_training_loop.py's resume table)."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import training.device as device_module
import training.evaluate as evaluate_module
import training.muon as muon_module
from data.prepared.text import prepare_data
from model.config import GPTConfig
from model.gpt import GPT, RMSNorm, sdpa
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from test_rms_norm_cpu import backward_functions
from test_training_loop import interrupt_at, max_weight_diff
from training.device import autocast
from training.evaluate import evaluate
from training.rms_norm_cpu import install_cpu_backward
from training.trainer import train

CPU = torch.device("cpu")


class OutputDtypes(TorchFunctionMode):
    """Records the dtype each torch function's result came out in, below autocast: the dtypes the
    arithmetic actually ran in, not the ones its inputs were handed in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[torch.dtype]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            self.seen.setdefault(getattr(func, "__name__", str(func)), set()).add(out.dtype)
        return out


@pytest.mark.parametrize("options", [
    dict(value_embeddings=True),  # tiny.yaml's model
    dict(positions="rope", tie_embeddings=False, value_embeddings=False),
    dict(attention="mla", kv_latent_dim=16, q_latent_dim=16, n_kv_head=2, positions="rope", value_embeddings=False),
], ids=["tiny", "rope-untied", "mla"])
def test_a_bf16_step_multiplies_in_bf16_and_keeps_norms_loss_weights_and_optimizer_in_fp32(options):
    torch.manual_seed(0)
    config = GPTConfig(**{**dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32), **options})
    model = GPT(config)
    install_cpu_backward(model)  # as the trainer does
    norm_io: dict[str, tuple[torch.dtype, torch.Tensor]] = {}
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            module.register_forward_hook(lambda m, inputs, out, name=name: norm_io.__setitem__(name, (inputs[0].dtype, out)))
    block_out = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, inputs, out: block_out.append(out.dtype))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))

    ops = OutputDtypes()
    with ops, autocast(CPU, torch.bfloat16):
        logits, loss = model(idx, targets)
    loss.backward()

    # Every matmul and what is computed from its output before it joins the residual stream: bf16.
    # Attention itself computes in fp32 on the CPU (model.gpt.sdpa: its bf16 kernels are the slow
    # ones), from bf16 inputs, and hands its output back in bf16.
    assert ops.seen["linear"] == {torch.bfloat16} and ops.seen["scaled_dot_product_attention"] == {torch.float32}
    activations = [op for op in ("silu", "sigmoid") if op in ops.seen]
    assert activations and all(ops.seen[op] == {torch.bfloat16} for op in activations)
    assert logits.dtype == torch.bfloat16
    # The embeddings and the residual stream they start: fp32 (an fp32 + bf16 sum is fp32).
    assert ops.seen["embedding"] == {torch.float32} and block_out and set(block_out) == {torch.float32}
    # Every norm computes in fp32 and takes the fused CPU backward: those on the residual stream
    # read and give fp32; those inside attention read a matmul's bf16 and give it back in bf16.
    assert norm_io
    for name, (dtype_in, out) in norm_io.items():
        assert "RMSNormCPUFunctionBackward" in backward_functions(out) and out.dtype == dtype_in, name
        assert (dtype_in == torch.float32) == (name.startswith("blocks.") and name.endswith(("attn_norm", "ffn_norm"))
                                               or name == "norm"), name
    # The loss is autocast's fp32 cross-entropy of the bf16 logits: the logits are rounded, the
    # softmax and the sum are not.
    assert loss.dtype == torch.float32 and ops.seen["cross_entropy"] == {torch.float32}
    exact = F.cross_entropy(logits.detach().float().view(-1, 64), targets.view(-1))
    assert loss.item() == pytest.approx(exact.item(), abs=1e-6)
    # Weights and their gradients: fp32.
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_attention_under_cpu_autocast_computes_in_fp32_and_nowhere_else():
    q, k, v = (torch.randn(2, 2, 8, 16, generator=torch.Generator().manual_seed(i)).bfloat16() for i in range(3))
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    with OutputDtypes() as under_autocast, autocast(CPU, torch.bfloat16):
        out = sdpa(q, k, v, is_causal=True)
    assert under_autocast.seen["scaled_dot_product_attention"] == {torch.float32}
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact.bfloat16())
    # Outside autocast bf16 stays bf16 (a bf16 model's inference), and fp32 is the plain call.
    with OutputDtypes() as outside:
        plain = sdpa(q, k, v, is_causal=True)
    assert outside.seen["scaled_dot_product_attention"] == {torch.bfloat16}
    assert torch.equal(plain, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.equal(sdpa(q.float(), k.float(), v.float(), is_causal=True), exact)


def tensors_in(value) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return [t for item in items for t in tensors_in(item)]


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_a_bf16_run_steps_its_optimizer_and_is_evaluated_in_fp32(monkeypatch, make_config, tmp_path, optimizer):
    # The evaluation is proved by the dtypes its arithmetic ran in and by its score, not by a bf16-fp32
    # gap in the score, which some CPUs' kernels round away.
    iterated, evaluations = [], []
    orthogonalize, score_batches = muon_module.orthogonalize, evaluate_module.score_batches

    def spy_orthogonalize(matrices, *args, **kwargs):
        # The Newton-Schulz iteration: its input, and whether autocast would round its matmuls.
        iterated.append((matrices.dtype, torch.is_autocast_enabled("cpu")))
        return orthogonalize(matrices, *args, **kwargs)

    def spy_score_batches(*args, **kwargs):
        with OutputDtypes() as ops:
            result = score_batches(*args, **kwargs)
        evaluations.append(ops.seen["linear"])
        return result

    monkeypatch.setattr(muon_module, "orthogonalize", spy_orthogonalize)
    monkeypatch.setattr(evaluate_module, "score_batches", spy_score_batches)
    config = make_config(train={"optimizer": optimizer, "precision": "bf16", "max_steps": 6}, eval={"interval": 3})
    result = train(config, progress=False)
    monkeypatch.undo()
    assert (set(iterated) == {(torch.float32, False)}) == (optimizer == "muon")
    state = load_trainer_state(tmp_path / "run")
    assert state["precision"] == "bf16" and {v.dtype for v in state["model"].values()} == {torch.float32}
    moments = [v for v in tensors_in(state["optimizer"]) if v.dim()]  # moments and momenta, not step counts
    assert moments and {v.dtype for v in moments} == {torch.float32}
    assert len(evaluations) >= 3 and all(seen == {torch.float32} for seen in evaluations)  # steps 3 and 6, final
    # The final pass scored the kept weights (model.safetensors) over final_max_batches batches.
    kept = load_pretrained(tmp_path / "run")
    val_tokens = prepare_data(config.data, progress=False).val_tokens()
    fp32 = evaluate(kept, val_tokens, torch.ones(config.model.vocab_size, dtype=torch.long),
                    block_size=config.model.block_size, batch_size=8, max_batches=config.eval.final_max_batches,
                    device=CPU).loss
    assert result.val_loss == pytest.approx(fp32, rel=1e-6)


def test_auto_resumes_in_the_runs_own_precision_on_a_cpu_that_would_choose_another(make_config, tmp_path,
                                                                                   monkeypatch):
    # Started on a CPU without bf16 dot products (auto: fp32), resumed on one with them (auto: bf16).
    sections = dict(train={"precision": "auto", "max_steps": 6}, eval={"interval": 0}, run={"checkpoint_interval": 3})
    monkeypatch.setattr(device_module, "cpu_has_bf16_dot_products", lambda: False)
    expected = train(make_config(tmp_path / "straight", **sections), progress=False)
    broken = make_config(tmp_path / "broken", **sections)
    interrupt_at(monkeypatch, 3)
    assert train(broken, progress=False).step == 3
    monkeypatch.undo()
    monkeypatch.setattr(device_module, "cpu_has_bf16_dot_products", lambda: True)
    assert device_module.resolve_precision("auto", CPU) == torch.bfloat16  # what a new run would take here
    resumed = train(broken, resume=True, progress=False)
    assert resumed.val_loss == pytest.approx(expected.val_loss, abs=1e-6)
    state = load_trainer_state(tmp_path / "broken")
    assert state["precision"] == "fp32" and max_weight_diff(load_trainer_state(tmp_path / "straight")["model"], state["model"]) == 0.0
    # An explicit setting is obeyed on resume, and saved as the run's own from then on.
    longer = make_config(tmp_path / "broken", **{**sections, "train": {"precision": "bf16", "max_steps": 7}})
    train(longer, resume=True, progress=False)
    assert load_trainer_state(tmp_path / "broken")["precision"] == "bf16"
