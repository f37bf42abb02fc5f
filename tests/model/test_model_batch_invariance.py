"""BatchInvariantLinear: a one-token row gets the same bits alone and in any batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.gpt import DECODE_ROW_BLOCK, BatchInvariantLinear, batch_invariant


def layer(n_in: int, n_out: int, seed: int) -> BatchInvariantLinear:
    torch.manual_seed(seed)
    return BatchInvariantLinear(n_in, n_out, bias=False)


def test_each_row_equals_itself_alone_in_any_batch_and_slot():
    linear = layer(128, 384, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 128, generator=g)
    with torch.inference_mode(), batch_invariant():
        alone = linear(x)
        for rows in (2, DECODE_ROW_BLOCK - 1, DECODE_ROW_BLOCK, DECODE_ROW_BLOCK + 1, 2 * DECODE_ROW_BLOCK + 3):
            for slot in (0, rows // 2, rows - 1):
                batch = torch.randn(rows, 1, 128, generator=g)
                batch[slot] = x[0]
                assert torch.equal(linear(batch)[slot], alone[0]), (rows, slot)
                assert torch.equal(linear(batch[:, 0])[slot], alone[0, 0])  # (B, C) rows, as the LM head sees them


def test_a_plain_product_would_not_be_batch_invariant_here_or_the_test_above_proves_little():
    # On the BLAS builds this project runs on, one row alone and the same row among others
    # take different kernels; if that ever stops being true this test says so, and the layer
    # could go back to a plain product.
    linear = layer(128, 384, seed=2)
    x = torch.randn(DECODE_ROW_BLOCK, 128, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        differs = any(not torch.equal(F.linear(x[i:i + 1], linear.weight)[0], F.linear(x, linear.weight)[i])
                      for i in range(DECODE_ROW_BLOCK))
    assert differs


def test_sequences_and_code_outside_the_context_take_the_plain_product():
    linear = layer(32, 48, seed=4)
    x = torch.randn(3, 5, 32)
    token = torch.randn(3, 1, 32, requires_grad=True)
    assert torch.equal(linear(token), F.linear(token, linear.weight))  # outside batch_invariant()
    with batch_invariant():
        assert torch.equal(linear(x), F.linear(x, linear.weight))  # a sequence per row
        linear(token).sum().backward()  # the padded path is differentiable too
    assert torch.allclose(token.grad, linear.weight.sum(0).expand(3, 1, 32), atol=1e-6)
