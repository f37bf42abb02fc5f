"""Multi-head latent attention (model.gpt.LatentAttention): the absorbed decode path against full recomputation in
the expanded form, and the latent-only cache. (Prefill, decoding and ragged rows of one cache, for every shape:
test_model_cache.py's latent rows; its tokens with and without the cache: tests/inference/test_generate_library.py.)"""

import pytest
import torch

from model.gpt import GPT
from run_testkit import build_model

RTOL, ATOL = 1e-5, 1e-5


def mla_model(kv_latent_dim: int, q_latent_dim: int | None = None, *, block_size: int = 40, **options) -> GPT:
    """A random MLA GPT with head_dim 16 and logits far from flat (``run_testkit.build_model``);
    ``options``: other GPTConfig fields."""
    return build_model(97, block_size, n_kv_head=4, attention="mla", kv_latent_dim=kv_latent_dim,
                       q_latent_dim=q_latent_dim, **options)


# kv_latent_dim below, equal to and above head_dim (16); with and without a query latent.
SHAPES = [(8, None), (16, 24), (48, None), (48, 8)]
ROPE = {"positions": "rope"}


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL * want.abs().max().item())


@pytest.mark.parametrize("options", [{}, ROPE], ids=["learned", "rope"])
def test_decoding_never_builds_per_head_keys_or_values(monkeypatch, options):
    model = mla_model(16, 24, **options)
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    cache = model.init_cache(2)
    with torch.no_grad():
        full = model(idx)
        model(idx[:, :8], cache=cache)  # the prefill expands them

        def expanded(*args):
            raise AssertionError("a one-token step up-projected the latents")

        for block in model.blocks:
            monkeypatch.setattr(block.attn.kv_up, "forward", expanded)
        assert_close(model(idx[:, 8:], cache=cache)[:, -1], full[:, -1])


@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("kv_latent_dim,q_latent_dim", SHAPES)
def test_absorbed_attention_equals_expanded_attention_on_the_same_weights(kv_latent_dim, q_latent_dim, positions):
    model = mla_model(kv_latent_dim, q_latent_dim, positions=positions)
    attention, rope_dim = model.blocks[1].attn, model.config.rope_dim
    x = torch.randn(2, 11, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        q, c = attention.split_heads(x, model.rotation(11))
        assert q.shape == (2, 4, 11, 16 + rope_dim) and c.shape == (2, 1, 11, kv_latent_dim + rope_dim)
        assert_close(attention.attend_absorbed(q, c, None), attention.attend_expanded(q, c, None))
        # A 4-token chunk on top of 7 cached positions: the bottom-right causal mask.
        mask = torch.ones(4, 11, dtype=torch.bool).tril(7)
        assert_close(attention.attend_absorbed(q[:, :, 7:], c, mask), attention.attend_expanded(q[:, :, 7:], c, mask))


@pytest.mark.parametrize("positions,cached", [("learned", 48), ("none", 48), ("rope", 48 + 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_holds_the_latent_only(dtype, positions, cached):
    """The latent, and with rotary positions the one shared rotary key (half of head_dim 16) beside it."""
    model = mla_model(48, 8, positions=positions)
    cache = model.init_cache(5, max_len=32, dtype=dtype)
    element = torch.tensor([], dtype=dtype).element_size()
    assert cache.buffers.keys() == {"latent"} and cache.nbytes() == model.config.n_layer * 5 * 32 * cached * element
