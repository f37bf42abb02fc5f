"""Row-blocked products: a one-token row gets the same bits alone and in any batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.gpt import DECODE_ROW_BLOCK, linear


def layer(n_in: int, n_out: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=False)


def test_each_row_equals_itself_alone_in_any_batch_and_slot():
    dense = layer(128, 384, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 128, generator=g)
    with torch.inference_mode():
        alone = linear(dense, x, row_blocks=True)
        for rows in (2, DECODE_ROW_BLOCK - 1, DECODE_ROW_BLOCK, DECODE_ROW_BLOCK + 1, 2 * DECODE_ROW_BLOCK + 3):
            for slot in (0, rows // 2, rows - 1):
                batch = torch.randn(rows, 1, 128, generator=g)
                batch[slot] = x[0]
                assert torch.equal(linear(dense, batch, row_blocks=True)[slot], alone[0]), (rows, slot)
                # (B, C) rows, as the LM head sees them
                assert torch.equal(linear(dense, batch[:, 0], row_blocks=True)[slot], alone[0, 0])


def test_a_plain_product_is_not_batch_invariant_on_this_host():
    # A fact about the host's BLAS, not about our code: where one row alone and the same row among
    # others take the same kernel, the row blocks are not needed and the test above proves little.
    dense = layer(128, 384, seed=2)
    x = torch.randn(DECODE_ROW_BLOCK, 128, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        differs = any(not torch.equal(F.linear(x[i:i + 1], dense.weight)[0], F.linear(x, dense.weight)[i])
                      for i in range(DECODE_ROW_BLOCK))
    if not differs:
        pytest.skip("this host's BLAS gives a row the same bits alone and in a batch of 16")


def test_without_row_blocks_the_product_is_the_plain_one():
    dense = layer(32, 48, seed=4)
    token = torch.randn(3, 1, 32, requires_grad=True)
    assert torch.equal(linear(dense, token), F.linear(token, dense.weight))
    linear(dense, token, row_blocks=True).sum().backward()  # the padded path is differentiable too
    assert torch.allclose(token.grad, dense.weight.sum(0).expand(3, 1, 32), atol=1e-6)
