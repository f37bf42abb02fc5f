"""Muon: the Newton-Schulz orthogonalisation and the optimizer step built on it. (Its state resuming
exactly: test_training_checkpoint.py's optimizer test.)"""

from contextlib import nullcontext

import pytest
import torch

from training.muon import NS_COEFFICIENTS, Muon, orthogonalize


@pytest.mark.parametrize("shape", [(48, 16), (16, 16), (16, 40)])
def test_orthogonalize_pushes_every_singular_value_near_one(shape):
    gen = torch.Generator().manual_seed(0)
    # A badly conditioned input: singular values spread over two orders of magnitude. (Five steps
    # multiply a tiny singular value by about 3.4445**5 = 485, so far smaller ones stay small.)
    u, _, vh = torch.linalg.svd(torch.randn(shape, generator=gen), full_matrices=False)
    spread = torch.logspace(0, -2, min(shape))
    out = orthogonalize(u @ torch.diag(spread) @ vh)
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.6 and s.max() < 1.25, s
    # Same singular vectors as the polar factor U Vᵀ: the direction is kept, only rescaled.
    polar = u @ vh
    assert (out * polar).sum() / (out.norm() * polar.norm()) > 0.98


@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (3, 24, 8), (2, 3, 8, 24)])
def test_orthogonalize_is_the_quintic_iteration_written_out(shape):
    # The iteration as the module doc states it, one plain step at a time, for any stack shape:
    # the fused multiply-adds must compute exactly this (in fp32, up to rounding).
    a, b, c = NS_COEFFICIENTS
    g = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    x = g if shape[-2] <= shape[-1] else g.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True)
    for _ in range(5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    expected = x if shape[-2] <= shape[-1] else x.mT  # each matrix of a stack on its own
    torch.testing.assert_close(orthogonalize(g), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(orthogonalize(1000.0 * g), expected, atol=1e-5, rtol=1e-5)  # and at any scale
    assert orthogonalize(g).dtype == torch.float32  # fp32 on the CPU, unlike torch.optim.Muon's bf16


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_step_matches_torch_muon_up_to_its_bf16_rounding():
    torch.manual_seed(0)
    shapes = [(64, 32), (32, 32), (32, 96)]
    ours = [torch.nn.Parameter(0.02 * torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    a = Muon(ours, lr=0.02, momentum=0.95, weight_decay=0.1)
    b = torch.optim.Muon(theirs, lr=0.02, momentum=0.95, weight_decay=0.1, nesterov=True, adjust_lr_fn="original")
    for _ in range(3):
        for p, q in zip(ours, theirs):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q, p0 in zip(ours, theirs, start):
        moved = (q - p0).abs().max()
        assert moved > 0.01  # the comparison below is not between two parameters that stayed put
        # torch iterates in bf16 (8 bits of mantissa): agree to a few percent of the step taken.
        assert (p - q).abs().max() < 0.03 * moved


def test_step_size_weight_decay_and_momentum_state():
    p = torch.nn.Parameter(torch.zeros(8, 4))
    opt = Muon([p], lr=0.1, momentum=0.9, weight_decay=0.5)
    p.grad = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    opt.step()
    # From zero weights, decay does nothing and the step is lr * sqrt(rows/cols) * orthogonalised
    # Nesterov momentum (which after one step is (1 - 0.9) * (1 + 0.9) * grad, same direction).
    expected = -0.1 * 2**0.5 * orthogonalize(p.grad)
    torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], 0.1 * p.grad)
    # A zero gradient: decay shrinks the weights by 1 - lr * wd, and the momentum (still along the
    # first gradient, and orthogonalisation ignores its scale) takes the same step again.
    first = p.detach().clone()
    p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(p.detach(), first * (1 - 0.1 * 0.5) + expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape, momentum, fragment", [
    ((4,), 0.95, "2-D weight matrices"), ((2, 2), 1.0, "momentum"), ((2, 2), 0.999, None),  # the bound and below it
])
def test_rejects_what_it_cannot_update(shape, momentum, fragment):
    with pytest.raises(ValueError, match=fragment) if fragment else nullcontext():
        Muon([torch.nn.Parameter(torch.ones(shape))], momentum=momentum)
