"""Autoregressive generation, with or without the KV cache, token for token the same.

The model sees a window of at most ``block_size`` tokens. When a new token would overflow it, the
window is cut to its most recent ``max(1, int(keep_fraction * block_size))`` tokens and re-encoded
from position 0. Learned absolute positions make this necessary (a cached key carries the position
it was written at, so keys cannot be shifted along), and cutting by a fraction rather than one
token at a time amortises the re-encoding over many cheap cached steps. The uncached path feeds
exactly the same window at every step, so both paths see identical inputs.

Cached and uncached generation both call ``model.sampling.sample_next_token``, so equal logits and
equal generator states give equal tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from model.gpt import GPT
from model.kv_cache import KVCache
from model.sampling import Generators, check_sampling_args, sample_next_token

# When the window reaches block_size, this fraction of it (the most recent tokens) is kept and
# re-encoded: half a window leaves room for block_size / 2 new tokens before the next re-encode.
KEEP_FRACTION = 0.5


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
    keep_fraction: float = KEEP_FRACTION,
    batch_invariant: bool = False,
    suppress_ids: Sequence[int] = (),
) -> Iterator[torch.Tensor]:
    """Yield each new token column (B,) as it is produced, ``max_new_tokens`` of them.

    ``idx`` (B, T) is the prompt, T >= 1; a prompt longer than block_size is cut to its last
    block_size tokens. Call with the model in eval mode (dropout would make steps random).
    Arguments are checked here, before the first token is asked for. ``batch_invariant``: the
    one-token steps take the serving engine's arithmetic (``GPT.next_token_logits``), so a
    request decodes here bit for bit as the server decodes it.
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
                    repetition_penalty=repetition_penalty, generator=generator, suppress_ids=tuple(suppress_ids))
    keep = kept_window(model.config.block_size, keep_fraction)
    return _generate(model, idx, max_new_tokens, sampling, use_cache, keep, batch_invariant)


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
    """``idx`` (B, T) followed by ``max_new_tokens`` generated tokens; ``options`` are
    ``generate_tokens``' keyword arguments."""
    columns = [token.unsqueeze(1) for token in generate_tokens(model, idx, max_new_tokens, **options)]
    return torch.cat([idx, *columns], dim=1)


def kept_window(block_size: int, keep_fraction: float = KEEP_FRACTION) -> int:
    """How many of the most recent tokens are re-encoded when the window overflows."""
    return max(1, int(keep_fraction * block_size))


def window_start(start: int, length: int, block_size: int, keep: int) -> int:
    """Where the model's window over tokens[start:length] begins, the newest token included: where
    it did while it fits ``block_size``; past that, at the most recent ``keep`` tokens, which are
    re-encoded from position 0. The one slide rule of generate.py and the serving engine."""
    return length - keep if length - start > block_size else start


# As a decorator on a generator function, inference_mode is entered on every resume and left on
# every yield, so it never leaks into the caller's code between tokens.
@torch.inference_mode()
def _generate(
    model: GPT, idx: torch.Tensor, max_new_tokens: int, sampling: dict, use_cache: bool, keep: int,
    batch_invariant: bool,
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
    # A whole-window cache: with batch_invariant, one-token steps then attend over the shapes the
    # serving engine's rows do, so a request decodes bit for bit alike here.
    cache = model.init_cache(batch) if use_cache else None
    invariant = dict(batch_invariant=batch_invariant)

    logits = _encode_window(model, tokens[:, start:n], cache, invariant)
    for step in range(max_new_tokens):
        token = sample_next_token(logits, prev_tokens=tokens[:, :n], **sampling)
        tokens[:, n] = token
        n += 1
        yield token
        if step == max_new_tokens - 1:
            break  # the next logits would never be used
        slid, start = start, window_start(start, n, block_size, keep)
        if start != slid:
            logits = _encode_window(model, tokens[:, start:n], cache, invariant)
        elif cache is not None:
            logits = model.next_token_logits(tokens[:, n - 1:n], cache, **invariant)
        else:
            logits = model.next_token_logits(tokens[:, start:n], **invariant)


def _encode_window(model: GPT, window: torch.Tensor, cache: KVCache | None, invariant: dict) -> torch.Tensor:
    """Next-token logits for a window placed at position 0 (refilling the cache, if any)."""
    if cache is not None:
        cache.reset()
    return model.next_token_logits(window, cache, **invariant)
