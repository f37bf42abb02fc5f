"""The prefix cache: the KV entries of recent prompts' pages, reused by prompts that begin alike.

A page is ``page`` consecutive positions of a cache row, starting at a multiple of ``page``. The
engine prefills every prompt in chunks of exactly one page on that grid, so a page's entries are a
function of the token ids from position 0 to its end and nothing else, whatever the run's
positions or attention kind, and it is only ever reused at its own positions: a request that
begins with the same tokens copies them in and skips exactly the chunks it would have computed,
bit for bit, so a hit cannot change its tokens. Only pages a prefill chunk computed are kept (a
one-token decode step writes other bits): the generated part of turn n is cached when turn n+1's
prompt, which resends it, is prefilled.

Memory is bounded by ``max_bytes``, counting the pages' entries and the index that finds them
(``page_cost``). Entries live in preallocated blocks of page slots: many small tensors would each
cost an allocation and fill the heap with holes it cannot give back. A page is keyed by its parent
page's id and its own tokens. The least recently used page is evicted first, and every lookup and
store touches a prompt's pages from the last to the first, so a page is always evicted before the
pages it extends (it is worthless without them)."""

import itertools
from collections import OrderedDict
from collections.abc import Sequence

import torch

Page = dict[str, torch.Tensor]  # entry name -> (n_layer, heads, page, dim)
_Key = tuple[int, tuple[int, ...]]  # (the parent page's id, 0 for none; this page's tokens)

# Upper bounds on what the index spends on one page (its key, its node, its share of the ordered
# dict's table) and on each of its tokens, checked in tests/serving/test_prefix_cache.py.
INDEX_BYTES_PER_PAGE = 512
INDEX_BYTES_PER_TOKEN = 48
BLOCK_BYTES = 2**20  # entries are allocated this many bytes of page slots at a time


def page_cost(page: int, entry_bytes: int) -> int:
    """Bytes one cached page takes: its entries (``entry_bytes``) and its share of the index."""
    return entry_bytes + INDEX_BYTES_PER_PAGE + INDEX_BYTES_PER_TOKEN * page


class PrefixCache:
    """Pages of ``page`` tokens, each found through every token from position 0 to its end."""

    def __init__(self, page: int, max_bytes: int) -> None:
        assert page >= 1 and max_bytes >= 0
        self.page = page
        self.max_bytes = max_bytes
        self._index: OrderedDict[_Key, tuple[int, int]] = OrderedDict()  # key -> (page id, slot)
        self._ids = itertools.count(1)
        self._blocks: list[Page] = []  # entry name -> (slots, n_layer, heads, page, dim)
        self._capacity = 0  # pages that fit max_bytes, known once the first page shows its size
        self._per_block = 0
        self._slots = 0  # slots handed out so far (all blocks hold this many, or a few more)
        self._free: list[int] = []
        self._shapes: dict[str, tuple[torch.Size, torch.dtype, torch.device]] | None = None

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        """What the cache holds: its blocks' storage and its index's share for each page."""
        storage = sum(t.untyped_storage().nbytes() for block in self._blocks for t in block.values())
        return storage + len(self._index) * (INDEX_BYTES_PER_PAGE + INDEX_BYTES_PER_TOKEN * self.page)

    def lookup(self, tokens: Sequence[int]) -> list[Page]:
        """The cached pages that begin ``tokens``, as views of the cache's blocks (copy them before
        the next store). The last token is never covered: its chunk must run for the logits."""
        keys = self._chain(tokens, (len(tokens) - 1) // self.page)
        self._touch(keys)
        return [self._entries(self._index[key][1]) for key in keys]

    def store(self, tokens: Sequence[int], entries: Page) -> None:
        """Keep ``entries``, the page that ends ``tokens`` (a whole number of pages long)."""
        assert len(tokens) % self.page == 0
        pages = len(tokens) // self.page
        keys = self._chain(tokens, pages)
        if len(keys) == pages - 1:  # not cached yet, and every page before it is
            if self._shapes is None:
                self._plan(entries)
            slot = self._free_slot(keys)
            if slot is not None:
                for name, block in self._blocks[slot // self._per_block].items():
                    block[slot % self._per_block].copy_(entries[name])
                parent = self._index[keys[-1]][0] if keys else 0
                self._index[(parent, tuple(tokens[-self.page:]))] = (next(self._ids), slot)
        self._touch(keys)  # a new page is the newest but for the pages before it

    def _chain(self, tokens: Sequence[int], pages: int) -> list[_Key]:
        """The keys of the first ``pages`` pages of ``tokens``, up to the first that is not cached."""
        keys: list[_Key] = []
        parent = 0
        for end in range(self.page, pages * self.page + 1, self.page):
            key = (parent, tuple(tokens[end - self.page:end]))
            found = self._index.get(key)
            if found is None:
                break
            keys.append(key)
            parent = found[0]
        return keys

    def _plan(self, entries: Page) -> None:
        entry_bytes = sum(t.numel() * t.element_size() for t in entries.values())
        self._capacity = self.max_bytes // page_cost(self.page, entry_bytes)
        self._per_block = max(1, min(self._capacity, BLOCK_BYTES // entry_bytes))
        self._shapes = {name: (t.shape, t.dtype, t.device) for name, t in entries.items()}

    def _free_slot(self, chain: list[_Key]) -> int | None:
        """A slot for a new page that extends ``chain``: a free one, a new one within the bound, or
        the least recently used page's. None if that page is in ``chain`` (the cache has room for
        no other page), since the new page would be unreachable."""
        if self._free:
            return self._free.pop()
        if self._slots < self._capacity:
            if self._slots == len(self._blocks) * self._per_block:
                size = min(self._per_block, self._capacity - self._slots)
                self._blocks.append({name: torch.empty((size, *shape), dtype=dtype, device=device)
                                     for name, (shape, dtype, device) in self._shapes.items()})
            self._slots += 1
            return self._slots - 1
        if not self._index:
            return None
        key, (_, slot) = self._index.popitem(last=False)
        if key in chain:
            self._free.append(slot)
            return None
        return slot

    def _entries(self, slot: int) -> Page:
        return {name: block[slot % self._per_block] for name, block in self._blocks[slot // self._per_block].items()}

    def _touch(self, keys: list[_Key]) -> None:
        """Mark a prompt's pages as just used, the first page last (newest); one evicted meanwhile
        (the last, by a store that found no other room) is skipped."""
        for key in reversed(keys):
            if key in self._index:
                self._index.move_to_end(key)
