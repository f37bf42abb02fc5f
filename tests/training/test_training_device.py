"""Device, precision and compile choices, and training under bf16 autocast on the CPU: which operations run
in bf16 and which stay fp32, that evaluation stays fp32, and that a resume keeps the run's own precision
(docs/training.md#precision; a bf16 run resuming exactly is a row of test_training_loop.py's resume table)."""

import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import training.device as device_module
import training.evaluate as evaluate_module
import training.muon as muon_module
from common.device import select_device
from common.errors import UserError
from data.prepared.text import prepare_data
from model.gpt import RMSNorm, sdpa
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from test_rms_norm_cpu import backward_functions
from test_training_loop import interrupt_at, max_weight_diff
from test_training_optim import tiny_gpt
from training.device import autocast, configure_backends, precision_name, resolve_precision, should_compile
from training.evaluate import evaluate
from training.resume_rules import run_precision
from training.rms_norm_cpu import install_cpu_backward
from training.trainer import train

CPU = torch.device("cpu")


def test_explicit_cpu_and_auto():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert select_device("cpu") == CPU and select_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_cuda_is_a_user_error():
    with pytest.raises(UserError, match="CUDA is not available"):
        select_device("cuda")


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_picks_bf16_on_a_cpu_with_bf16_dot_products_and_either_can_be_forced(monkeypatch, has_bf16):
    monkeypatch.setattr(device_module, "cpu_has_bf16_dot_products", lambda: has_bf16)
    assert resolve_precision("auto", CPU) == (torch.bfloat16 if has_bf16 else torch.float32)
    assert (resolve_precision("bf16", CPU), resolve_precision("fp32", CPU)) == (torch.bfloat16, torch.float32)
    # A resumed run: auto keeps the precision it trained in; an explicit setting changes it.
    for own in ("fp32", "bf16"):
        assert precision_name(resolve_precision("auto", CPU, run_own=own)) == own
        assert (resolve_precision("fp32", CPU, run_own=own), resolve_precision("bf16", CPU, run_own=own)) == (
            torch.float32, torch.bfloat16)


@pytest.mark.parametrize("setting, run_own, expected", [
    ("auto", None, torch.float32), ("auto", "fp32", torch.float32),
    ("bf16", None, r"^train.precision=bf16 but this GPU has no bf16 support; use --set train.precision=fp32$"),
    ("auto", "bf16", r"^train.precision=auto resumes the run's own bf16, but this GPU has no bf16 support; use "
                     r"--set train.precision=fp32$"),
])
def test_a_gpu_without_bf16_refuses_it_in_one_line_even_as_a_runs_own(monkeypatch, setting, run_own, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(UserError, match=expected) if isinstance(expected, str) else nullcontext():
        assert resolve_precision(setting, torch.device("cuda"), run_own=run_own) == expected
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16  # as before CPUs could choose bf16


def test_a_run_without_a_saved_precision_resumes_as_auto_chose_then():
    gpu = torch.device("cuda")
    assert run_precision(None, CPU) is None  # a new run
    assert (run_precision({"precision": "bf16"}, CPU), run_precision({"precision": "fp32"}, gpu)) == ("bf16", "fp32")
    # Saved before the precision was: auto was fp32 on every CPU, and chose on a GPU as it does now.
    assert (run_precision({}, CPU), run_precision({}, gpu)) == ("fp32", None)


@pytest.mark.parametrize("capabilities, expected", [
    ({"avx512_bf16": True, "amx_bf16": False}, True),  # AMD Zen 4, Intel Cooper Lake
    ({"avx512_bf16": True, "amx_bf16": True}, True),  # Intel Sapphire Rapids
    ({"avx512_bf16": False, "amx_bf16": False, "avx512_f": True, "avx2": True}, False),
    ({"architecture": "arm64", "bf16": True}, False),  # oneDNN's bf16 path on x86 is what auto knows
])
def test_the_cpu_is_asked_through_torch(monkeypatch, capabilities, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities, raising=False)
    assert device_module.cpu_has_bf16_dot_products() is expected


def test_without_torchs_answer_the_linux_kernel_is_asked(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 "
                    "avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert device_module.linux_cpu_flags(str(info)) >= {"avx512_bf16", "avx2"}
    assert device_module.linux_cpu_flags(str(tmp_path / "absent")) == set()  # not Linux
    for flags, expected in [({"avx2", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True),
                            ({"avx2", "avx512f"}, False), (set(), False)]:
        monkeypatch.setattr(device_module, "linux_cpu_flags", lambda flags=flags: flags)
        assert device_module.cpu_has_bf16_dot_products() is expected


@pytest.mark.skipif("avx512_bf16" not in device_module.linux_cpu_flags(), reason="needs a CPU whose kernel "
                    "reports avx512_bf16")
def test_on_a_cpu_with_avx512_bf16_auto_trains_in_bf16():
    # This host, unpatched: torch's answer (or the kernel's) must see what the kernel reports.
    assert resolve_precision("auto", CPU) == torch.bfloat16


def test_cpu_compiles_only_when_asked_and_autocast_is_a_no_op_in_fp32(monkeypatch, capsys):
    assert (should_compile("auto", CPU), should_compile(True, CPU), should_compile("auto", torch.device("cuda"))) == (
        False, True, True)
    for dtype in (torch.float32, torch.bfloat16):
        with autocast(CPU, dtype):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
    # Without a C++ compiler the CPU trains uncompiled, and says why.
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert should_compile(True, CPU) is False and "no C++ compiler" in capsys.readouterr().err
    # A GPU compiles with Triton, not the host C++ compiler: the setting stands.
    assert should_compile(True, torch.device("cuda")) is True


# Runs in a fresh interpreter: the allocator settings are process-wide and cannot be undone.
_PAGE_FAULT_PROBE = """
import resource, torch
import torch.nn.functional as F
from training.device import keep_freed_memory

x = torch.randn(16, 128, 128, requires_grad=True)
weight = torch.ones(128, requires_grad=True)
grad = torch.randn(16, 128, 128)

def faults_per_step():
    for _ in range(5):
        F.rms_norm(x, (128,), weight).backward(grad)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        F.rms_norm(x, (128,), weight).backward(grad)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50

default = faults_per_step()
accepted = keep_freed_memory()
print(default, accepted, faults_per_step())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings")
def test_keeping_freed_memory_stops_per_step_page_faults():
    # One 1 MiB activation is 256 pages; a forward and backward allocates several of them.
    out = subprocess.run([sys.executable, "-c", _PAGE_FAULT_PROBE], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    default, accepted, kept = out.stdout.split()
    if accepted != "True":
        pytest.skip("the C library is not glibc; keep_freed_memory() is a no-op there")
    if float(default) < 256:
        pytest.skip(f"this allocator already reuses freed memory ({default} page faults per step)")
    assert float(kept) < float(default) / 10, (default, kept)


def test_configure_backends_on_the_cpu_keeps_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(device_module, "keep_freed_memory", lambda: calls.append(1) or True)
    configure_backends(CPU)
    assert calls == [1]


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
    model = tiny_gpt(**options)
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
