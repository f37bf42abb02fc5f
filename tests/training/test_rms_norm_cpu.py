"""RMSNorm's CPU training path (LayerNorm's backward kernel plus a correction) against the formula."""

import pytest
import torch

from model.gpt import GPT, GPTConfig, RMSNorm
from training.rms_norm_cpu import CPUBackwardRMSNorm, RMSNormCPUFunction, install_cpu_backward


def textbook_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def norm_with_gains(dim: int, seed: int) -> RMSNorm:
    norm = CPUBackwardRMSNorm(dim, eps=1e-5)
    with torch.no_grad():  # unit gains would hide a mix-up of weight and input gradients
        norm.weight.copy_(torch.rand(dim, generator=torch.Generator().manual_seed(seed)) + 0.5)
    return norm


@pytest.mark.parametrize("shape", [(7, 16), (3, 5, 16), (2, 3, 4, 16)])
def test_training_path_matches_the_formula_and_its_autograd_gradients(shape):
    norm = norm_with_gains(shape[-1], seed=len(shape))
    gen = torch.Generator().manual_seed(1)
    # A mean far from zero makes LayerNorm's centring term large, so forgetting to undo it fails.
    x = (torch.randn(shape, generator=gen) + 3.0).requires_grad_()
    grad_out = torch.randn(shape, generator=gen)

    out = norm(x)
    assert out.grad_fn is not None and "RMSNormCPUFunction" in type(out.grad_fn).__name__
    grad_x, grad_w = torch.autograd.grad(out, (x, norm.weight), grad_out)
    with torch.no_grad():  # inference takes the plain kernel, to the same values
        plain = norm(x)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, out.detach(), rtol=1e-6, atol=1e-6)
    x_ref = x.detach().double().requires_grad_()
    w_ref = norm.weight.detach().double().requires_grad_()
    out_ref = textbook_rms_norm(x_ref, w_ref, norm.eps)
    grad_x_ref, grad_w_ref = torch.autograd.grad(out_ref, (x_ref, w_ref), grad_out.double())
    torch.testing.assert_close(out, out_ref.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_x, grad_x_ref.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_w, grad_w_ref.float(), rtol=1e-5, atol=1e-5)


def test_gradients_pass_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 4, 8, generator=gen, dtype=torch.float64) + 1.0).requires_grad_()
    w = (torch.rand(8, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: RMSNormCPUFunction.apply(a, b, 1e-5), (x, w))


def test_only_the_gradients_asked_for_are_computed():
    norm = norm_with_gains(16, seed=3)
    x = torch.randn(4, 16)  # an input that needs no gradient, as token embeddings under no_grad
    (grad_w,) = torch.autograd.grad(norm(x).square().sum(), norm.weight)
    w_ref = norm.weight.detach().clone().requires_grad_()
    (grad_w_ref,) = torch.autograd.grad(textbook_rms_norm(x, w_ref, norm.eps).square().sum(), w_ref)
    torch.testing.assert_close(grad_w, grad_w_ref, rtol=1e-5, atol=1e-5)

    norm.weight.requires_grad_(False)
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(norm(x).sum(), x)
    x_ref = x.detach().clone().requires_grad_()
    (grad_x_ref,) = torch.autograd.grad(textbook_rms_norm(x_ref, norm.weight, norm.eps).sum(), x_ref)
    torch.testing.assert_close(grad_x, grad_x_ref, rtol=1e-5, atol=1e-6)


def test_a_second_derivative_is_refused_rather_than_wrong():
    norm = norm_with_gains(8, seed=5)
    x = torch.randn(3, 8, requires_grad=True)
    (grad_x,) = torch.autograd.grad(norm(x).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|not differentiable|does not require grad"):
        grad_x.sum().backward()


# The trainer's precision=bf16 on a CPU: the norm's statistics are never rounded to bf16. A residual-stream
# norm reads fp32 and gives fp32; latent attention's norms read a matmul's bf16 output and give bf16.
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2**-8)], ids=["fp32", "bf16"])
def test_under_bf16_autocast_the_norm_computes_in_float32_with_the_fused_backward(dtype, rtol):
    norm = norm_with_gains(16, seed=7)
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(3, 5, 16, generator=gen) + 2.0).to(dtype).requires_grad_()
    grad_out = torch.randn(3, 5, 16, generator=gen).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
    assert out.dtype == dtype and "RMSNormCPUFunctionBackward" in backward_functions(out)
    grad_x, grad_w = torch.autograd.grad(out, (x, norm.weight), grad_out)
    assert (grad_x.dtype, grad_w.dtype) == (dtype, torch.float32)

    # The formula in fp64 on the same values; in bf16 only the output and the input gradient are
    # rounded (a relative step of 2^-8).
    x_ref = x.detach().double().requires_grad_()
    w_ref = norm.weight.detach().double().requires_grad_()
    out_ref = textbook_rms_norm(x_ref, w_ref, norm.eps)
    grad_x_ref, grad_w_ref = torch.autograd.grad(out_ref, (x_ref, w_ref), grad_out.double())
    torch.testing.assert_close(out.double(), out_ref, rtol=rtol, atol=1e-6)
    torch.testing.assert_close(grad_x.double(), grad_x_ref, rtol=rtol, atol=rtol * grad_x_ref.abs().max().item())
    torch.testing.assert_close(grad_w.double(), grad_w_ref, rtol=1e-5, atol=1e-5)


def backward_functions(out: torch.Tensor) -> set[str]:  # every autograd node ``out`` was computed through
    names, stack = set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.add(type(fn).__name__)
            stack.extend(f for f, _ in fn.next_functions)
    return names


def test_only_an_installed_model_takes_the_cpu_backward_and_its_parameters_stay_the_same():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_kv_head=1, n_embd=16))
    idx = torch.randint(0, 11, (2, 8))
    assert not any("RMSNormCPUFunction" in name for name in backward_functions(model(idx)))  # not by default
    params, state = list(model.parameters()), model.state_dict()
    install_cpu_backward(model)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 1 and all(type(m) is CPUBackwardRMSNorm for m in norms)
    assert all(a is b for a, b in zip(params, model.parameters())) and model.state_dict().keys() == state.keys()
    assert any("RMSNormCPUFunction" in name for name in backward_functions(model(idx)))
