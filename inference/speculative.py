"""Speculative decoding: proposals that one pass checks, and the rule that keeps the output exact.

A decode step of a small model costs about the same for one token as for a few: its time goes to
Python, dispatch and reading the weights. A proposer guesses up to k tokens; the row's newest
token and the guesses go through the model in one pass; the guesses are checked in order, every
accepted one is emitted, and at the first rejected one a token is drawn from what the model says
there instead (all accepted: one more from the logits after the last). So a step emits 1 to k + 1
tokens.

Two proposers: ``lookup``, prompt lookup (Saxena, 2023), the tokens that followed the latest
earlier occurrence of the row's last n-gram in its own prompt and reply, which wins where a reply
repeats its input and needs no second model; and ``draft``, a smaller run with the same tokenizer
decoding k tokens ahead in a cache of its own, with the request's sampling settings.

The check (Leviathan et al., 2023; Chen et al., 2023). Greedy decoding accepts a guess when it is
the argmax, so its output is plain greedy decoding's token for token (up to the last-bit rounding
of the wider pass). Sampling accepts a guess x drawn from q with probability min(1, p(x) / q(x)),
where p is plain sampling's distribution at that position (``token_distribution`` of
``adjusted_logits``, the penalty reading the guesses accepted before), and a rejection draws from
max(0, p - q), normalised: every emitted token is distributed exactly as plain sampling's. Prompt
lookup's q is a point mass. The draws come from the request's own generator, more of them than
plain sampling takes, so a seed samples other tokens than plain decoding with that seed does.
Everything a proposer does for a row depends on that row alone, so a request still gets what it
gets served alone."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from inference.batch_invariant import row_blocked
from inference.sampling import SamplingSettings, adjusted_logits, draw, token_distribution, uniform_per_row
from inference.settings import Speculation
from model.gpt import GPT

# The longest n-gram prompt lookup matches first, then shorter ones. A single token recurs
# everywhere, and its guesses would mostly cost a wide pass for nothing.
LOOKUP_NGRAMS = (3, 2)


class Row(Protocol):
    """What a proposer reads of an engine row (``inference.engine``'s request)."""

    row: int  # its cache row
    tokens: list[int]  # prompt and reply so far, the newest last
    settings: SamplingSettings
    generator: torch.Generator


@dataclass
class Proposal:
    tokens: list[int]  # the guesses, in order
    q: torch.Tensor | None = None  # (len(tokens), vocab): the distribution each was drawn from; None: point masses


class Speculator:
    """The engine's side: ``propose`` guesses for rows, ``check`` decides what a checked pass emits.
    The counts: row steps taken (checked or plain), guesses proposed and accepted."""

    def __init__(self, speculation: Speculation, max_batch: int, batch_invariant: bool) -> None:
        self.k = speculation.k
        self.steps = self.proposed = self.accepted = 0
        if speculation.proposer == "lookup":
            self.proposer: PromptLookup | DraftProposer = PromptLookup(max_batch)
        else:
            self.proposer = DraftProposer(speculation.draft, max_batch, speculation.k, batch_invariant)

    def propose(self, rows: Sequence[Row], room: Sequence[int]) -> list[Proposal]:
        """Up to ``min(k, room[i])`` guesses for each row (none when ``room[i]`` is 0)."""
        proposals = self.proposer.propose(rows, [min(self.k, r) for r in room])
        self.steps += len(rows)
        self.proposed += sum(len(p.tokens) for p in proposals)
        return proposals

    def check(self, row: Row, proposal: Proposal, logits: torch.Tensor) -> list[int]:
        """The tokens a row emits after a pass over its newest token and ``proposal`` gave ``logits``
        (len(proposal.tokens) + 1, vocab): the guesses accepted in order, then one more."""
        tokens = accepted_tokens(logits, proposal, row.settings, row.tokens, row.generator)
        self.accepted += len(tokens) - 1
        return tokens


def accepted_tokens(logits: torch.Tensor, proposal: Proposal, settings: SamplingSettings, history: list[int],
                    generator: torch.Generator) -> list[int]:
    """The check described in the module's docstring. ``logits[i]`` follows ``history`` and the
    first i guesses; ``history`` feeds the repetition penalty."""
    guesses = proposal.tokens
    emitted: list[int] = []
    # Without a penalty every position's distribution is known before any is checked.
    shared = None if settings.repetition_penalty != 1.0 else _distributions(logits, settings)
    for i in range(len(guesses) + 1):
        if shared is not None:
            here = shared[i:i + 1]
        else:
            prev = torch.tensor([history + emitted], device=logits.device)
            here = _distributions(logits[i:i + 1], settings, prev)
        if settings.temperature == 0:  # greedy: ``here`` holds the adjusted logits
            best = int(here.argmax())
            if i == len(guesses) or best != guesses[i]:
                return emitted + [best]
            emitted.append(best)
            continue
        p = here[0]
        if i == len(guesses):
            return emitted + [_draw(p, generator)]
        x = guesses[i]
        q_x = 1.0 if proposal.q is None else float(proposal.q[i, x])
        # u < min(1, p(x) / q(x)), with q(x) > 0: x was drawn from q.
        if float(uniform_per_row(1, generator, p.device)) * q_x < float(p[x]):
            emitted.append(x)
            continue
        if proposal.q is None:
            residual = p.index_fill(0, torch.tensor([x], device=p.device), 0.0)
        else:
            residual = (p - proposal.q[i].to(p.device)).clamp_min(0.0)
        return emitted + [_draw(residual, generator)]
    raise AssertionError("unreachable: the last position always emits")


def _distributions(logits: torch.Tensor, settings: SamplingSettings, prev: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of ``logits``: the adjusted logits (greedy) or plain sampling's distribution."""
    adjusted = adjusted_logits(logits, repetition_penalty=settings.repetition_penalty, prev_tokens=prev,
                               suppress_ids=settings.suppress_ids)
    if settings.temperature == 0:
        return adjusted
    return token_distribution(adjusted, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(draw(weights.unsqueeze(0), uniform_per_row(1, generator, weights.device))[0])


# Proposers. Each keeps per-row state, tied to the request it was made for: a cache row that holds
# another request starts afresh.


@dataclass
class _LookupRow:
    owner: Row
    # n-gram -> the end (exclusive) of its latest occurrence among those indexed: every one ending
    # before ``indexed``, so never the row's newest tokens themselves.
    ends: dict[tuple[int, ...], int]
    indexed: int = 1


class PromptLookup:
    """Guesses from the row's own tokens: what followed the latest earlier occurrence of its last
    n tokens (n from ``LOOKUP_NGRAMS``, longest first). The index grows by the row's new tokens at
    each call, so a step never rescans the history. A match that overlaps its own continuation (a
    loop) repeats the loop."""

    def __init__(self, max_batch: int) -> None:
        self.rows: list[_LookupRow | None] = [None] * max_batch

    def propose(self, rows: Sequence[Row], limits: Sequence[int]) -> list[Proposal]:
        return [Proposal(self._guess(row, limit)) for row, limit in zip(rows, limits)]

    def _guess(self, row: Row, limit: int) -> list[int]:
        state = self.rows[row.row]
        if state is None or state.owner is not row:
            state = self.rows[row.row] = _LookupRow(row, {})
        tokens = row.tokens
        end = len(tokens)
        for e in range(state.indexed, end):  # n-grams ending at e, which token e follows
            for n in LOOKUP_NGRAMS:
                if e >= n:
                    state.ends[tuple(tokens[e - n:e])] = e
        state.indexed = max(state.indexed, end)
        if limit == 0:
            return []
        for n in LOOKUP_NGRAMS:
            found = state.ends.get(tuple(tokens[end - n:])) if end >= n else None
            if found is not None:
                guesses: list[int] = []
                for i in range(found, found + limit):
                    guesses.append(tokens[i] if i < end else guesses[i - end])
                return guesses
        return []


@dataclass
class _DraftRow:
    owner: Row
    start: int = 0  # the draft's window is owner.tokens[start:]
    encoded: list[int] = field(default_factory=list)  # the tokens in the draft's cache row, from ``start``


class DraftProposer:
    """A smaller model guessing ahead in its own cache, one row per engine row.

    When the row's tokens and the guesses outgrow the draft's context it starts again from the
    most recent half of it, encoded afresh (right for every kind of positions). Before guessing,
    its cache row is cut back to what it shares with the row's tokens (it may hold rejected
    guesses) and the rest is encoded. Rows encode together when they encode as many tokens; under
    batch invariance a catch-up wider than the whole-buffer width (a new prompt) runs alone."""

    def __init__(self, draft: GPT, max_batch: int, k: int, batch_invariant: bool) -> None:
        self.model = row_blocked(draft) if batch_invariant else draft
        self.whole = k + 1 if batch_invariant else 0
        self.cache = draft.init_cache(max_batch, whole_buffers=self.whole)
        self.block = draft.config.block_size
        self.rows: list[_DraftRow | None] = [None] * max_batch

    def propose(self, rows: Sequence[Row], limits: Sequence[int]) -> list[Proposal]:
        limits = [min(limit, self.block) for limit in limits]
        guesses: list[list[int]] = [[] for _ in rows]
        dists: list[list[torch.Tensor]] = [[] for _ in rows]
        busy = [i for i, limit in enumerate(limits) if limit > 0]
        logits = self._encode({i: self._catch_up(rows[i], limits[i]) for i in busy}, rows)
        while busy:
            for i in busy:
                token, q = self._guess(rows[i], guesses[i], logits[i])
                guesses[i].append(token)
                if q is not None:
                    dists[i].append(q)
            busy = [i for i in busy if len(guesses[i]) < limits[i]]
            # The draft reads its last guesses, one token per row.
            logits = self._encode({i: [guesses[i][-1]] for i in busy}, rows)
        return [Proposal(g, torch.cat(d) if d else None) for g, d in zip(guesses, dists)]

    def _catch_up(self, row: Row, limit: int) -> list[int]:
        """Cut the draft's cache row back to what it shares with the row's tokens; returns the
        tokens it has still to encode (the newest at least)."""
        state = self.rows[row.row]
        if state is None or state.owner is not row:
            state = self.rows[row.row] = _DraftRow(row)
        tokens = row.tokens
        if len(tokens) - state.start + limit - 1 > self.block:
            keep = max(1, min(self.block // 2, self.block - limit + 1))
            state.start, state.encoded = max(0, len(tokens) - keep), []
        window = tokens[state.start:]
        shared = 0
        for mine, theirs in zip(state.encoded, window[:-1]):  # the newest token is always fed
            if mine != theirs:
                break
            shared += 1
        self.cache.rewind(row.row, shared)
        state.encoded = window[:shared]
        return window[shared:]

    def _encode(self, chunks: dict[int, list[int]], rows: Sequence[Row]) -> dict[int, torch.Tensor]:
        """Append ``chunks[i]`` to row i's draft cache row; the logits after each (1, vocab)."""
        widths: dict[int, list[int]] = {}
        for i, chunk in chunks.items():
            widths.setdefault(len(chunk), []).append(i)
        passes = []
        for width, group in widths.items():
            # Under batch invariance a wider pass reads only its rows' own lengths: one row at a time.
            alone = self.whole and width > self.whole
            passes += [[i] for i in group] if alone else [group]
        logits = {}
        for group in passes:
            ids = torch.tensor([chunks[i] for i in group], device=self.cache.device)
            out = self.model.next_token_logits(ids, self.cache, [rows[i].row for i in group])
            for j, i in enumerate(group):
                logits[i] = out[j:j + 1]
                self.rows[rows[i].row].encoded += chunks[i]
        return logits

    @staticmethod
    def _guess(row: Row, guesses: list[int], logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The next guess, drawn as the row's settings draw a token, and its distribution (None
        when greedy)."""
        settings = row.settings
        prev = None
        if settings.repetition_penalty != 1.0:
            prev = torch.tensor([row.tokens + guesses], device=logits.device)
        q = _distributions(logits, settings, prev)
        if settings.temperature == 0:
            return int(q.argmax()), None
        return _draw(q[0], row.generator), q
