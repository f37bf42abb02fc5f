"""The model as ONNX sees it: explicit past tensors in, present tensors out.

Our ``KVCache`` is a Python object with host-side lengths, which an exported graph cannot hold, so
these wrappers pass the cache as plain tensors named the way Hugging Face Optimum names decoders
(``past_key_values.{i}.key``/``.value`` in, ``present.{i}.key``/``.value`` out). They run the
model's own modules (embeddings, norms, the attention's projections, the feed-forward, the head);
only the attention arithmetic is written out here, because the graph needs one form for every
chunk length and a mask from tensors rather than from the cache's Python state.

- ``DynamicDecoder``: any batch, any number of new tokens, any past length (0 for the first call);
  presents are the pasts with the new tokens appended. ``attention_mask`` (batch, past + new) marks
  real tokens with 1 and padding with 0, so rows of different lengths share a batch (left padding).
- ``StaticDecoder``: fixed shapes for runtimes that need them. The cache is preallocated at
  ``block_size`` positions; each call adds one token per row, written at ``position_ids``, and
  reads the slots that ``attention_mask`` (batch, block_size) marks as written.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.gpt import GPT, Block


def input_names(n_layer: int) -> list[str]:
    pasts = [f"past_key_values.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *pasts]


def output_names(n_layer: int) -> list[str]:
    return ["logits", *(f"present.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value"))]


def _attend(block: Block, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor,
            allowed: torch.Tensor) -> torch.Tensor:
    """Block ``block``'s attention output for queries q over keys k, v where ``allowed``
    (batch, 1, new, keys) is True, then its residual and feed-forward: the rest of the block."""
    attn = block.attn
    group = attn.n_head // attn.n_kv_head
    # Repeated K/V heads rather than SDPA's enable_gqa: the plain form exports on every opset.
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    B, _, T, _ = q.shape
    x = x + attn.proj(y.transpose(1, 2).reshape(B, T, -1))
    return x + block.ffn(block.ffn_norm(x))


class DynamicDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *pasts) -> (logits, *presents)``."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *pasts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model = self.model
        T = input_ids.shape[1]
        S = attention_mask.shape[1]  # past + new
        # Query i (at slot S - T + i) reads the real keys up to its own slot, and always itself:
        # a padding query with nothing to read would turn into NaN and reach later layers' keys.
        slots = torch.arange(S, device=input_ids.device)
        query_slots = (torch.arange(T, device=input_ids.device) + (S - T)).unsqueeze(1)
        causal = slots.unsqueeze(0) <= query_slots
        allowed = (causal & attention_mask.bool()[:, None, None, :]) | (slots.unsqueeze(0) == query_slots)
        x = model.tok_emb(input_ids) + model.pos_emb(position_ids)
        presents: list[torch.Tensor] = []
        for i, block in enumerate(model.blocks):
            q, k, v = block.attn.split_heads(block.attn_norm(x))
            k = torch.cat([pasts[2 * i], k], dim=2)
            v = torch.cat([pasts[2 * i + 1], v], dim=2)
            presents += [k, v]
            x = _attend(block, x, k, v, q, allowed)
        return (model.lm_head(model.norm(x)), *presents)


class StaticDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *caches) -> (logits, *caches)``: one
    token per row (batch, 1) written at ``position_ids`` (batch, 1) into caches of block_size slots."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model = self.model
        slots = torch.arange(model.config.block_size, device=input_ids.device)
        # A select instead of a scatter: the same shapes in and out, and an op every runtime has.
        written = (slots.unsqueeze(0) == position_ids)[:, None, :, None]  # (batch, 1, slots, 1)
        allowed = (attention_mask.bool() | written[:, 0, :, 0])[:, None, None, :]
        x = model.tok_emb(input_ids) + model.pos_emb(position_ids)
        presents: list[torch.Tensor] = []
        for i, block in enumerate(model.blocks):
            q, k, v = block.attn.split_heads(block.attn_norm(x))
            k = torch.where(written, k, caches[2 * i])
            v = torch.where(written, v, caches[2 * i + 1])
            presents += [k, v]
            x = _attend(block, x, k, v, q, allowed)
        return (model.lm_head(model.norm(x)), *presents)
