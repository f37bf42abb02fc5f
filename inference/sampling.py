"""Decoding's rules: the settings every decoder shares, the sampler, and the window slide.

``SamplingSettings`` is the one description of a decode (generate.py, the chat, the server,
training's samples, the export's generation config). The edges that take it from a user check it
once with ``check_sampling_args``; the sampler trusts it. Every sampled row consumes exactly one
uniform draw, whatever its logits, so a row's random stream never depends on what the model
predicted. The loop that applies these rules, for every caller, is ``inference.engine``."""

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


Generators = torch.Generator | Sequence[torch.Generator] | None

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit value


@dataclass(frozen=True)
class SamplingSettings:
    """How to decode one request; the defaults are generate.py's. temperature 0 is greedy;
    ``top_k``/``top_p`` None turn those filters off; ``seed`` None: a fresh seed. A reply ends after
    ``max_new_tokens`` or just before a ``stop`` string; ``suppress_ids`` are never sampled."""

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = 0.95
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    suppress_ids: tuple[int, ...] = ()

    def token_options(self) -> dict:
        """The keyword arguments of ``sample_next_token`` these settings set."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    repetition_penalty=self.repetition_penalty, suppress_ids=self.suppress_ids)


def new_seed() -> int:
    """A fresh random seed, small enough to read and type back to repeat a run."""
    return secrets.randbelow(2**31)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator: a seed draws the same numbers whatever the model's device (the draws are
    moved to the logits), and every backend supports it."""
    return torch.Generator().manual_seed(seed)


def check_sampling_args(
    temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float
) -> None:
    """Raise ValueError naming the first bad sampling setting."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no limit), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or None (no limit), got {top_p!r}")
    if not (isinstance(repetition_penalty, (int, float)) and math.isfinite(repetition_penalty)
            and repetition_penalty > 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0 (1.0 = off), "
                         f"got {repetition_penalty!r}")


def apply_repetition_penalty(logits: torch.Tensor, prev_tokens: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on every token id in ``prev_tokens`` (B, L) of its row, once however
    often it occurs: a positive logit is divided by ``penalty`` and a negative one multiplied, so
    with penalty > 1 a seen token always becomes less likely."""
    if penalty == 1.0 or prev_tokens.numel() == 0:
        return logits
    seen = logits.gather(-1, prev_tokens)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    # Repeated ids scatter the same value, so the result does not depend on write order.
    return logits.scatter(-1, prev_tokens, seen)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k (exactly k ids, ties broken by ``torch.topk``),
    then outside the top-p nucleus: the smallest prefix of ids by descending probability (ties by
    id) whose mass is >= p, and always at least the most likely id."""
    if top_k is not None and top_k < logits.size(-1):
        values, indices = logits.topk(top_k, dim=-1)
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, indices, values)
    if top_p is not None and top_p < 1.0:
        logits = logits.masked_fill(outside_nucleus(torch.softmax(logits, dim=-1), top_p), float("-inf"))
    return logits


# The nucleus is first looked for among this many most likely ids: a partial sort of them costs a
# fraction of sorting the whole vocabulary, which sampling would otherwise do for every token.
NUCLEUS_CANDIDATES = 256


def outside_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """True for every id outside the top-p nucleus of ``probs`` (B, vocab), as ``filter_logits``
    defines it; only rows whose nucleus passes the candidates sort their whole vocabulary."""
    vocab = probs.size(-1)
    top, ids = probs.topk(min(NUCLEUS_CANDIDATES, vocab), dim=-1)
    # topk orders tied probabilities arbitrarily: put the candidates in id order, then sort them
    # stably by probability, as a stable sort of the whole vocabulary would.
    ids, by_id = ids.sort(dim=-1)
    top, order = top.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    inside = _nucleus_prefix(top, top_p)
    outside = torch.ones_like(probs, dtype=torch.bool).scatter_(-1, ids.gather(-1, order), ~inside)
    # topk may have cut a tie at the smallest candidate, so a row's answer stands only where its
    # nucleus and the first id after it lie strictly above that probability.
    unsettled = (inside.sum(-1) >= (top > top[..., -1:]).sum(-1)).nonzero().flatten()
    if top.size(-1) < vocab and unsettled.numel():
        full, order = probs[unsettled].sort(dim=-1, descending=True, stable=True)
        outside[unsettled] = torch.ones_like(full, dtype=torch.bool).scatter_(-1, order, ~_nucleus_prefix(full, top_p))
    return outside


def _nucleus_prefix(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which of the ids, sorted by descending probability, the nucleus holds: an id is needed
    while the mass strictly before it is < p, and the first one always."""
    mass_before = F.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
    inside = mass_before < top_p
    inside[..., 0] = True
    return inside


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    prev_tokens: torch.Tensor | None = None,
    generator: Generators = None,
    suppress_ids: Sequence[int] = (),
) -> torch.Tensor:
    """One token id per row of ``logits`` (B, vocab). temperature 0 is greedy (no randomness
    consumed); otherwise each row draws one uniform u and takes the id where the cumulative
    probability (in id order) first exceeds u. ``generator``: one shared by the rows in order, or
    one per row (row i then consumes only generator i)."""
    logits = adjusted_logits(logits, repetition_penalty=repetition_penalty, prev_tokens=prev_tokens,
                             suppress_ids=suppress_ids)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = token_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return draw(probs, uniform_per_row(logits.shape[0], generator, logits.device))


def adjusted_logits(
    logits: torch.Tensor, *, repetition_penalty: float = 1.0, prev_tokens: torch.Tensor | None = None,
    suppress_ids: Sequence[int] = (),
) -> torch.Tensor:
    """``logits`` in fp32 with the suppressed ids at -inf and the repetition penalty applied."""
    logits = logits.float()
    if suppress_ids:
        logits = logits.index_fill(-1, torch.tensor(suppress_ids, device=logits.device), float("-inf"))
    if prev_tokens is not None:
        logits = apply_repetition_penalty(logits, prev_tokens, repetition_penalty)
    return logits


def token_distribution(logits: torch.Tensor, *, temperature: float, top_k: int | None = None,
                       top_p: float | None = None) -> torch.Tensor:
    """The probabilities (B, vocab) a sampled token is drawn from, given ``adjusted_logits`` and a
    temperature above 0; speculative decoding checks proposals against exactly this."""
    return torch.softmax(filter_logits(scale_by_temperature(logits, temperature), top_k, top_p), dim=-1)


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The id of each row of ``weights`` (B, vocab; not necessarily normalised) whose share of the
    row's total the uniform draw ``u`` (B,) falls in, ids taken in id order."""
    # Id order rather than sorted order: a tiny change in the logits then moves the
    # boundaries between ids a tiny amount, instead of reordering near-tied ids.
    cdf = weights.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, u.unsqueeze(-1) * cdf[:, -1:], right=True).squeeze(-1)
    # u * total can round up to total itself; fall back to the last id that has probability.
    last_allowed = weights.shape[-1] - 1 - (weights.flip(-1) > 0).int().argmax(dim=-1)
    return torch.minimum(idx, last_allowed)


def scale_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``, with rows that overflow (a temperature of 1e-39: softmax of
    inf - inf is NaN) replaced by their limit as T -> 0, uniform over the ids tied at the maximum."""
    scaled = logits / temperature
    overflow = torch.isposinf(scaled).any(dim=-1, keepdim=True)
    if not bool(overflow.any()):
        return scaled
    at_max = logits == logits.amax(dim=-1, keepdim=True)
    limit = torch.zeros_like(logits).masked_fill(~at_max, float("-inf"))
    return torch.where(overflow, limit, scaled)


def uniform_per_row(batch: int, generator: Generators, device: torch.device) -> torch.Tensor:
    """One U[0, 1) draw per row, on ``device``, from the generator(s) as ``sample_next_token`` says."""
    if generator is None:
        return torch.rand(batch, device=device)
    if isinstance(generator, torch.Generator):
        return torch.rand(batch, generator=generator, device=generator.device).to(device)
    generators = list(generator)
    if len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for {batch} rows; "
                         f"pass one per row or a single one")
    return torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators]).to(device)


# A re-encoded window keeps its most recent half: cutting by a fraction rather than one token at a
# time amortises the re-encoding over many cached steps. A rolling window encodes nothing when it
# slides, so it keeps more; it still evicts a quarter at a time, not one token per step, because
# each eviction turns every moved rotary key once more and rounds it: a key is turned at most about
# four times in its life.
KEEP_FRACTION = 0.5
ROLL_KEEP_FRACTION = 0.75
# The first tokens a rolling window keeps: trained models pour much attention onto the first few
# tokens whatever they are (StreamingLLM's attention sinks). A window under 16 tokens keeps a
# quarter of itself, leaving the rest for the recent tokens the next one depends on most.
SINKS = 4


def default_sinks(block_size: int) -> int:
    """The sinks a rolling window of ``block_size`` tokens keeps unless told otherwise."""
    return min(SINKS, block_size // 4)


def rolls_past_window(positions: str) -> bool:
    """Whether a run with these positions rolls its cache past the window rather than re-encoding:
    rotary and no positions do; a learned position is written into each cached key."""
    return positions != "learned"


@dataclass(frozen=True)
class Window:
    """The window slide: what the model sees of a row's tokens once they outgrow ``block_size``.

    A row's window is ``tokens[start:]`` until it slides. Re-encoding (``sinks`` None; learned
    positions, where a cached key carries the position it was written at): the window moves on to
    its most recent ``keep`` tokens, encoded again from position 0. Rolling (rotary or no
    positions): the window keeps its first ``sinks`` tokens and its most recent ones, ``keep`` in
    all; ``evicted`` counts the tokens dropped between them, and the cache drops them too
    (``KVCache.drop``), so nothing is encoded again."""

    block_size: int
    keep: int  # tokens the window holds right after it slides, the newest included
    sinks: int | None = None  # None: re-encode; otherwise roll, keeping this many first tokens

    @classmethod
    def for_positions(cls, positions: str, block_size: int, keep_fraction: float | None = None,
                      sinks: int | None = None, *, roll: bool = True) -> "Window":
        """The slide a run's positions allow: learned ones re-encode; rotary and none roll (unless
        ``roll`` is False), keeping ``sinks`` first tokens (None: ``default_sinks``). ``keep_fraction``
        None: that slide's default."""
        rolls = rolls_past_window(positions) and roll
        fraction = (ROLL_KEEP_FRACTION if rolls else KEEP_FRACTION) if keep_fraction is None else keep_fraction
        keep = max(1, int(fraction * block_size))
        if not rolls:
            return cls(block_size, keep)
        sinks = default_sinks(block_size) if sinks is None else sinks
        if not 0 <= sinks < block_size:
            raise ValueError(f"sinks must be 0 to {block_size - 1} (the window less one), got {sinks}")
        return cls(block_size, max(keep, sinks + 1), sinks)

    @property
    def rolls(self) -> bool:
        return self.sinks is not None

    def held(self, start: int, evicted: int, length: int) -> int:
        """How many of ``tokens[start:length]`` the window holds."""
        return length - start - evicted

    def tokens(self, tokens: Sequence[int], start: int, evicted: int) -> list[int]:
        """The window's tokens, in the order of their positions."""
        if evicted == 0:
            return list(tokens[start:])
        return [*tokens[start:start + self.sinks], *tokens[start + self.sinks + evicted:]]

    def slide(self, start: int, evicted: int, length: int) -> tuple[int, int]:
        """``(start, evicted)`` once ``tokens[:length]`` are in: unchanged while the window fits
        ``block_size``; past that, what it keeps (see the class)."""
        held = self.held(start, evicted, length)
        if held <= self.block_size:
            return start, evicted
        if self.sinks is None:
            return length - self.keep, 0
        return start, evicted + held - self.keep
