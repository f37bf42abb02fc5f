"""The model as ONNX sees it: explicit past tensors in, present tensors out.

Our ``KVCache`` is a Python object with host-side lengths, which an exported graph cannot hold, so
these wrappers pass the cache as plain tensors named the way Hugging Face Optimum names decoders
(``past_key_values.{i}.key``/``.value`` in, ``present.{i}.key``/``.value`` out). What a layer
caches is what its attention declares for ``KVCache`` (``cache_entries``), so the names follow it:
multi-head latent attention caches one ``past_key_values.{i}.latent`` per layer instead.
The wrappers run the model's own modules (embeddings, norms, the attention's projections, the
feed-forward, each block's input and the head), so the model's options come along: QK-norm in the
projections and the latent's expansion, value embeddings in the values, ReLU² in the feed-forward,
the residual scalars in ``GPT.block_input``, the softcap in ``GPT.logits``. Only the attention
arithmetic is written out here, because the graph needs one form for every chunk length and a mask
from tensors rather than from the cache's state.

- ``DynamicDecoder``: any batch, any number of new tokens, any past length (0 for the first call);
  presents are the pasts with the new tokens appended. ``attention_mask`` (batch, past + new) marks
  real tokens with 1 and padding with 0, so rows of different lengths share a batch (left padding).
- ``StaticDecoder``: fixed shapes for runtimes that need them. The cache is preallocated at
  ``block_size`` positions; each call adds one token per row, written at ``position_ids``, and
  reads the slots that ``attention_mask`` (batch, block_size) marks as written.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.gpt import GPT

# Optimum's names for grouped-query attention's entries; any other entry keeps its own name.
ONNX_ENTRY_NAMES = {"k": "key", "v": "value"}


def cache_entries(model: GPT) -> dict[str, tuple[int, int]]:
    """Each cached tensor's ONNX name (``key``, ``value``) and its (heads, dim) per token and layer."""
    entries = model.blocks[0].attn.cache_entries()
    return {ONNX_ENTRY_NAMES.get(name, name): shape for name, shape in entries.items()}


def cache_names(model: GPT) -> list[str]:
    """``{layer}.{entry}`` for every cached tensor, in the order the graph takes them."""
    return [f"{i}.{name}" for i in range(model.config.n_layer) for name in cache_entries(model)]


def input_names(model: GPT) -> list[str]:
    return ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in cache_names(model))]


def output_names(model: GPT) -> list[str]:
    return ["logits", *(f"present.{n}" for n in cache_names(model))]


Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (past, new) -> present


def _decode(model: GPT, input_ids: torch.Tensor, position_ids: torch.Tensor, pasts: tuple[torch.Tensor, ...],
            combine: Combine, allowed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Logits and presents: every block with its attention reading ``combine(past, new)`` where
    ``allowed`` (batch, 1, new, keys) is True."""
    x = x0 = model.tok_emb(input_ids) + model.pos_emb(position_ids)
    per_layer = len(pasts) // model.config.n_layer
    presents: list[torch.Tensor] = []
    for i, block in enumerate(model.blocks):
        x = model.block_input(i, x, x0)
        attn = block.attn
        value_embedding = model.value_embedding(i, input_ids)
        extra = {} if value_embedding is None else {"value_embedding": value_embedding}
        q, *new = attn.split_heads(block.attn_norm(x), **extra)
        cached = [combine(past, n) for past, n in zip(pasts[i * per_layer:(i + 1) * per_layer], new)]
        presents += cached
        y = _attend(attn, q, cached, allowed)
        B, _, T, _ = q.shape
        x = x + attn.proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + block.ffn(block.ffn_norm(x))
    return (model.logits(model.norm(x)), *presents)


def _attend(attn: nn.Module, q: torch.Tensor, cached: list[torch.Tensor], allowed: torch.Tensor) -> torch.Tensor:
    """q's attention over what the layer caches, where ``allowed``: grouped-query attention's keys
    and values, or multi-head latent attention's one latent (``model.gpt.LatentAttention``), whose expanded form
    (every head's key and value up-projected from the latent) takes the mask as it is."""
    if len(cached) == 1:
        return attn.attend_expanded(q, cached[0], allowed)
    k, v = cached
    group = attn.n_head // attn.n_kv_head
    # Repeated K/V heads rather than SDPA's enable_gqa: the plain form exports on every opset.
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


class DynamicDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *pasts) -> (logits, *presents)``."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *pasts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        T = input_ids.shape[1]
        S = attention_mask.shape[1]  # past + new
        # Query i (at slot S - T + i) reads the real keys up to its own slot, and always itself:
        # a padding query with nothing to read would turn into NaN and reach later layers' keys.
        slots = torch.arange(S, device=input_ids.device)
        query_slots = (torch.arange(T, device=input_ids.device) + (S - T)).unsqueeze(1)
        causal = slots.unsqueeze(0) <= query_slots
        allowed = (causal & attention_mask.bool()[:, None, None, :]) | (slots.unsqueeze(0) == query_slots)
        append = lambda past, new: torch.cat([past, new], dim=2)  # noqa: E731
        return _decode(self.model, input_ids, position_ids, pasts, append, allowed)


class StaticDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *caches) -> (logits, *caches)``: one
    token per row (batch, 1) written at ``position_ids`` (batch, 1) into caches of block_size slots."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        slots = torch.arange(self.model.config.block_size, device=input_ids.device)
        written = slots.unsqueeze(0) == position_ids  # (batch, slots)
        allowed = (attention_mask.bool() | written)[:, None, None, :]
        # A select instead of a scatter: the same shapes in and out, and an op every runtime has.
        write = lambda cache, new: torch.where(written[:, None, :, None], new, cache)  # noqa: E731
        return _decode(self.model, input_ids, position_ids, caches, write, allowed)
