"""Batch invariance (``inference.batch_invariant``): a row gets the same bits alone and in any batch."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inference.batch_invariant import ROW_BLOCK, RowBlockedLinear, row_blocked
from model.config import GPTConfig
from model.gpt import GPT

# On this project's CPU hosts (MKL, two threads) a product this deep sums a row in another order
# once it has 64 rows or more; a single thread, or a shallower product, keeps the 16-row order.
WIDE_IN, WIDE_OUT, MANY_ROWS, THREADS = 1024, 512, 4 * ROW_BLOCK, 2


def blocked(n_in: int, n_out: int, seed: int) -> RowBlockedLinear:
    torch.manual_seed(seed)
    return RowBlockedLinear(n_in, n_out, bias=False)


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(previous)


def skip_unless_many_rows_change_the_sum(weight: torch.Tensor, x: torch.Tensor) -> None:
    """Skip unless a plain product of ``x`` (MANY_ROWS rows) gives its first 16 rows other bits
    than a product of those 16 alone: only then can a test see the 16-row split at work."""
    if torch.equal(F.linear(x, weight)[:ROW_BLOCK], F.linear(x[:ROW_BLOCK], weight)):
        pytest.skip(f"this host's BLAS sums a {weight.shape[1]}-deep row alike in {ROW_BLOCK} and {x.shape[0]} "
                    f"rows on {torch.get_num_threads()} threads, so removing the {ROW_BLOCK}-row split cannot show")


def test_each_row_equals_itself_alone_in_any_batch_and_slot():
    dense = blocked(128, 384, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 128, generator=g)
    with torch.inference_mode():
        alone = dense(x)
        for rows in (2, ROW_BLOCK - 1, ROW_BLOCK, ROW_BLOCK + 1, 2 * ROW_BLOCK + 3):
            for slot in (0, rows // 2, rows - 1):
                batch = torch.randn(rows, 1, 128, generator=g)
                batch[slot] = x[0]
                assert torch.equal(dense(batch)[slot], alone[0]), (rows, slot)
                assert torch.equal(dense(batch[:, 0])[slot], alone[0, 0])  # (B, C) rows, as the LM head sees them


def test_a_plain_product_is_not_batch_invariant_on_this_host():
    # A fact about the host's BLAS, not about our code: where one row alone and the same row among
    # others take the same kernel, the row blocks are not needed and the test above proves little.
    dense = blocked(128, 384, seed=2)
    x = torch.randn(ROW_BLOCK, 128, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        differs = any(not torch.equal(F.linear(x[i:i + 1], dense.weight)[0], F.linear(x, dense.weight)[i])
                      for i in range(ROW_BLOCK))
    if not differs:
        pytest.skip("this host's BLAS gives a row the same bits alone and in a batch of 16")


def test_a_row_among_many_blocks_keeps_the_bits_of_one_block(two_threads):
    dense = blocked(WIDE_IN, WIDE_OUT, seed=5)
    x = torch.randn(MANY_ROWS, WIDE_IN, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        skip_unless_many_rows_change_the_sum(dense.weight, x)
        assert torch.equal(dense(x)[:ROW_BLOCK], dense(x[:ROW_BLOCK]))
        assert torch.equal(dense(x)[:1], dense(x[:1]))


def test_the_row_blocked_twin_decodes_each_row_of_a_wide_batch_as_alone(two_threads):
    torch.manual_seed(7)
    config = GPTConfig(vocab_size=64, block_size=4, n_layer=1, n_head=8, n_kv_head=2, n_embd=WIDE_OUT,
                       ffn_hidden=WIDE_IN)
    plain = GPT(config).eval()
    twin = row_blocked(plain)
    tokens = torch.randint(0, 64, (MANY_ROWS, 1), generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        skip_unless_many_rows_change_the_sum(plain.blocks[0].ffn.down.weight, torch.randn(MANY_ROWS, WIDE_IN))
        batched = twin.next_token_logits(tokens, twin.init_cache(MANY_ROWS, whole_buffers=True))
        for i in (0, ROW_BLOCK + 3, MANY_ROWS - 1):
            alone = twin.next_token_logits(tokens[i:i + 1], twin.init_cache(1, whole_buffers=True))
            assert torch.equal(batched[i:i + 1], alone), f"row {i}"


def test_the_twin_shares_the_weights_and_leaves_the_model_plain():
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    twin = row_blocked(model)
    assert all(a is b for a, b in zip(model.parameters(), twin.parameters()))
    assert twin.lm_head.weight is twin.tok_emb.weight  # still tied
    assert type(model.lm_head) is nn.Linear and type(twin.lm_head) is RowBlockedLinear
    idx = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(twin(idx), model(idx), atol=1e-6, rtol=0)  # fp32 rounding of another order
    # The row-blocked product is differentiable.
    dense = blocked(32, 48, seed=4)
    token = torch.randn(3, 1, 32, requires_grad=True)
    torch.testing.assert_close(dense(token), F.linear(token, dense.weight), atol=1e-6, rtol=0)
    dense(token).sum().backward()
    assert torch.allclose(token.grad, dense.weight.sum(0).expand(3, 1, 32), atol=1e-6)
