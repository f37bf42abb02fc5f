"""Autoregressive generation, with or without the KV cache, token for token the same.

The model sees a window of at most ``block_size`` tokens. When a new token would overflow it, the
window is cut to its most recent ``max(1, int(keep_fraction * block_size))`` tokens and re-encoded
from position 0. Learned absolute positions make this necessary (a cached key carries the position
it was written at, so keys cannot be shifted along), and cutting by a fraction rather than one
token at a time amortises the re-encoding over many cheap cached steps. The uncached path feeds
exactly the same window at every step, so both paths see identical inputs.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from model.gpt import GPT
from model.kv_cache import KVCache
from model.sampling import Generators, check_sampling_args, sample_next_token


def generate_tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    use_cache: bool = True,
    generator: Generators = None,
    keep_fraction: float = 0.5,
) -> Iterator[torch.Tensor]:
    """Yield each new token column (B,) as it is produced, ``max_new_tokens`` of them.

    ``idx`` (B, T) is the prompt, T >= 1; a prompt longer than block_size is cut to its last
    block_size tokens. Call with the model in eval mode (dropout would make steps random).
    Arguments are checked here, before the first token is asked for.
    """
    if idx.dim() != 2 or idx.shape[1] == 0 or idx.dtype != torch.long:
        raise ValueError(f"idx must be a non-empty (batch, time) LongTensor of token ids, got "
                         f"shape {tuple(idx.shape)} and dtype {idx.dtype}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not (isinstance(keep_fraction, (int, float)) and 0.0 < keep_fraction <= 1.0):
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction!r}")
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    per_row = generator is not None and not isinstance(generator, torch.Generator)
    if per_row and len(generator) != idx.shape[0]:
        raise ValueError(f"got {len(generator)} generators for {idx.shape[0]} rows; "
                         f"pass one per row or a single one")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition_penalty, generator=generator)
    keep = max(1, int(keep_fraction * model.config.block_size))
    return _generate(model, idx, max_new_tokens, sampling, use_cache, keep)


# As a decorator on a generator function, inference_mode is entered on every resume and left on
# every yield, so it never leaks into the caller's code between tokens.
@torch.inference_mode()
def _generate(
    model: GPT, idx: torch.Tensor, max_new_tokens: int, sampling: dict, use_cache: bool, keep: int
) -> Iterator[torch.Tensor]:
    if max_new_tokens == 0:
        return
    block_size = model.config.block_size
    batch, prompt_len = idx.shape
    # Every token of every row, preallocated: the penalty reads it and the window is a view of it.
    tokens = torch.empty(batch, prompt_len + max_new_tokens, dtype=torch.long, device=idx.device)
    tokens[:, :prompt_len] = idx
    n = prompt_len
    start = max(0, n - block_size)  # the model sees tokens[:, start:n]
    cache = None
    if use_cache:
        cache = model.init_cache(batch, max_len=min(block_size, n - start + max_new_tokens))
    penalise = sampling["repetition_penalty"] != 1.0

    logits = _encode_window(model, tokens[:, start:n], cache)
    for step in range(max_new_tokens):
        token = sample_next_token(logits, prev_tokens=tokens[:, :n] if penalise else None, **sampling)
        tokens[:, n] = token
        n += 1
        yield token
        if step == max_new_tokens - 1:
            break  # the next logits would never be used
        if n - start > block_size:
            start = n - keep
            logits = _encode_window(model, tokens[:, start:n], cache)
        elif cache is not None:
            logits = model.next_token_logits(tokens[:, n - 1:n], cache)
        else:
            logits = model.next_token_logits(tokens[:, start:n])


def _encode_window(model: GPT, window: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Next-token logits for a window placed at position 0 (refilling the cache, if any)."""
    if cache is not None:
        cache.reset()
    return model.next_token_logits(window, cache)
