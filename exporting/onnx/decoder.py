"""The model as ONNX sees it: explicit past tensors in, present tensors out.

Our ``KVCache`` holds host-side lengths, which an exported graph cannot, so these wrappers pass
the cache as plain tensors named as Hugging Face Optimum names decoders
(``past_key_values.{i}.key``/``.value`` in, ``present.{i}.key``/``.value`` out; latent attention's
``.latent``). They call the model itself, handing its attention the pasts through
``_GraphCache``, so every option of the model comes along. The dynamic graph is traced on several
new tokens, so it records attention's general path (a chunk under a mask), exact for one token too.

- ``DynamicDecoder``: any batch, any number of new tokens, any past length (0 for the first call);
  presents are the pasts with the new tokens appended. ``attention_mask`` (batch, past + new) marks
  real tokens with 1 and padding with 0, so rows of different lengths share a batch (left padding).
- ``StaticDecoder``: fixed shapes for runtimes that need them. The cache is preallocated at
  ``block_size`` positions; each call adds one token per row, written at ``position_ids``, and
  reads the slots that ``attention_mask`` (batch, block_size) marks as written."""

from collections.abc import Callable

import torch
from torch import nn

from model.gpt import GPT

# Optimum's names for grouped-query attention's entries; any other entry keeps its own name.
ONNX_ENTRY_NAMES = {"k": "key", "v": "value"}


def cache_entries(model: GPT) -> dict[str, tuple[int, int]]:
    """Each cached tensor's ONNX name (``key``, ``value``) and its (heads, dim) per token and layer."""
    return {ONNX_ENTRY_NAMES.get(name, name): shape for name, shape in model.cache_entries().items()}


def cache_names(model: GPT) -> list[str]:
    """``{layer}.{entry}`` for every cached tensor, in the order the graph takes them."""
    return [f"{i}.{name}" for i in range(model.config.n_layer) for name in cache_entries(model)]


def input_names(model: GPT) -> list[str]:
    return ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in cache_names(model))]


def output_names(model: GPT) -> list[str]:
    return ["logits", *(f"present.{n}" for n in cache_names(model))]


Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (past, new) -> present


class _GraphCache:
    """The pasts as the model's attention reads a cache (``model.kv_cache.LayerCache``): each
    layer's new entries are combined with its pasts into the presents, read where ``allowed``
    (batch, 1, new, keys) is True."""

    def __init__(self, pasts: tuple[torch.Tensor, ...], n_layer: int, combine: Combine, allowed: torch.Tensor) -> None:
        self.pasts, self.per_layer = pasts, len(pasts) // n_layer
        self.combine, self.allowed = combine, allowed
        self.presents: list[torch.Tensor] = []

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        pasts = self.pasts[layer * self.per_layer:(layer + 1) * self.per_layer]
        presents = [self.combine(past, n) for past, n in zip(pasts, new)]
        self.presents += presents
        return presents, self.allowed


def _decode(model: GPT, input_ids: torch.Tensor, position_ids: torch.Tensor, pasts: tuple[torch.Tensor, ...],
            combine: Combine, allowed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Logits and presents of the model run at ``position_ids`` over the pasts."""
    cache = _GraphCache(pasts, model.config.n_layer, combine, allowed)
    logits = model.logits(model.hidden_states(input_ids, position_ids, cache))
    return (logits, *cache.presents)


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
