"""The prefix cache: the KV entries of recent prompts' pages, reused by prompts that begin alike.

A page is ``page`` consecutive positions of a cache row, starting at a multiple of ``page``. The
engine prefills every prompt in chunks of exactly one page on that grid, so the entries of a page
are a function of the tokens from position 0 to the page's end and nothing else: a request that
begins with the same tokens can copy them in and skip exactly the chunks it would have computed,
and the chunks it does compute see bit for bit the inputs they would have seen. That is why a hit
cannot change a request's tokens. Only pages that a prefill chunk computed are kept; a position
written by a one-token decode step holds other bits (other matrix shapes), so the generated part
of turn n is cached when turn n+1's prompt, which resends it, is prefilled.

Positions are learned and absolute (no RoPE): the position is added to the input before the
first layer and attention knows nothing of positions, so a page's entries are a function of token
ids alone (those from position 0 to the page's end), and copying them back is all a hit does,
whatever the entries are named (K and V, or one MLA latent). With RoPE, keys are rotated inside
attention by their position: a prefix reused at its own positions would still be exact, but each
kind of entry would need a rule for where the rotation lives (MLA caches a separate rotated key
beside its latent, since a rotation cannot pass through the latent's up-projection), and reuse at
any other offset would need the keys re-rotated.

Memory is bounded by ``max_bytes``, evicting the least recently used page first. A page is
worthless without the pages before it, so every lookup and store touches a prompt's pages from
the last to the first: a page is always evicted before the pages it extends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

Page = dict[str, torch.Tensor]  # entry name -> (n_layer, heads, page, dim)


class PrefixCache:
    """Pages of ``page`` tokens, keyed by every token from position 0 to the page's end."""

    def __init__(self, page: int, max_bytes: int) -> None:
        assert page >= 1 and max_bytes >= 0
        self.page = page
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._pages: OrderedDict[tuple[int, ...], Page] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def lookup(self, tokens: Sequence[int]) -> list[Page]:
        """The cached pages that begin ``tokens``, in order. The last token is never covered: its
        chunk must run to give the next-token logits."""
        found = []
        for end in range(self.page, len(tokens), self.page):
            entries = self._pages.get(tuple(tokens[:end]))
            if entries is None:
                break
            found.append(entries)
        self._touch(tokens, len(found))
        return found

    def store(self, tokens: Sequence[int], entries: Page) -> None:
        """Keep ``entries``, the page that ends ``tokens`` (a whole number of pages long)."""
        assert len(tokens) % self.page == 0
        key = tuple(tokens)
        size = sum(t.numel() * t.element_size() for t in entries.values())
        if key in self._pages or size > self.max_bytes:
            self._touch(tokens, len(tokens) // self.page)
            return
        while self.nbytes + size > self.max_bytes:
            _, evicted = self._pages.popitem(last=False)
            self.nbytes -= sum(t.numel() * t.element_size() for t in evicted.values())
        self._pages[key] = entries
        self.nbytes += size
        self._touch(tokens, len(tokens) // self.page)

    def _touch(self, tokens: Sequence[int], pages: int) -> None:
        """Mark a prompt's first ``pages`` pages as just used, the first page last (newest)."""
        for end in range(pages * self.page, 0, -self.page):
            key = tuple(tokens[:end])
            if key in self._pages:
                self._pages.move_to_end(key)
