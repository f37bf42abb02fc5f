"""The compiled decode step: one token for every row of the engine's cache, in one graph.

Eager decoding at batch 1 spends most of a step in Python and per-op dispatch, not arithmetic.
``torch.compile`` traces the step once into Inductor's kernels (C++ on the CPU) and, on a GPU,
replays it as one CUDA graph (mode ``reduce-overhead``). Both need the step's shapes fixed, so the
step always runs every one of the cache's rows at its whole buffer under a mask (``StaticStep``):
positions and which rows decode are tensors, not shapes, and a generation of any length is compiled
once. A row with nothing to decode (free, or still encoding its prompt) writes a spare slot past
``block_size`` that no mask lets anyone read, and its logits are dropped.

Prompts are still encoded eagerly: their lengths vary, and a compile per length would cost more
than it saves. The compiled kernels may round differently from the eager ones in the last bits;
the eager path stays the reference (tests/inference/test_compiled_step.py bounds the difference).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping

import torch

from common.errors import UserError
from model import GPT, KVCache
from model.kv_cache import StaticStep

def choose_compile(flag: bool | None, *, use_cache: bool = True, device: torch.device,
                   long_running: bool = False) -> bool:
    """Whether a command compiles its decode step. ``--compile``/``--no-compile`` (``flag``) decide
    when given; by default only a long-running command (the server) on CUDA compiles, where the
    CUDA-graph step is a few times faster than eager and its compile (seconds) is soon repaid.
    A single generation or chat usually is not long enough to repay it, and on the CPU Inductor's
    C++ build takes tens of seconds, as long as many thousand small-model tokens save
    (docs/results.md, "A GPU: small.yaml and the compiled decode step"). Refuses, in one line, a
    compile that cannot run."""
    if flag is None:
        return long_running and use_cache and device.type == "cuda"
    if flag and not use_cache:
        raise UserError("--compile compiles the cached decode step; drop --no-cache or --compile")
    reason = compiler_missing(device) if flag else None
    if reason is not None:
        raise UserError(f"{reason}; drop --compile")
    return flag


def compiled_notice(seconds: float) -> str:
    """The one line a command prints about its compile."""
    return f"compiled the decode step in {seconds:.1f} s (once per process; --no-compile skips it)"


def compiler_missing(device: torch.device) -> str | None:
    """Why a compiled step cannot run on ``device``, or None when it can."""
    if device.type == "cuda":
        return None
    if device.type != "cpu":
        return f"torch.compile's decode step runs on cpu or cuda, not {device.type}"
    if not any(name and shutil.which(name) for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++")):
        return "torch.compile needs a C++ compiler on the CPU (c++, g++ or clang++, or $CXX) and none was found"
    return None


def spare_slot_cache(model: GPT, rows: int, whole_buffers: bool) -> KVCache:
    """A cache of ``rows`` rows of block_size positions plus the spare slot idle rows write."""
    weight = model.tok_emb.weight
    return KVCache(model.config.n_layer, rows, model.config.block_size + 1, model.cache_entries(),
                   device=weight.device, dtype=weight.dtype, whole_buffers=whole_buffers)


class CompiledStep:
    """The decode step over every row of ``cache`` (made by ``spare_slot_cache``), compiled for
    ``model``; building it compiles it, and ``compile_seconds`` says how long that took."""

    def __init__(self, model: GPT, cache: KVCache) -> None:
        self.model = model
        self.cache = cache
        self.buffers = tuple(cache.buffers.values())
        self.spare = cache.max_len - 1
        self.cuda = cache.device.type == "cuda"
        if self.cuda:  # the graph writes the cache in place: its address must not change
            for buffer in self.buffers:
                torch._dynamo.mark_static_address(buffer)
        # On a GPU the step replays as a CUDA graph; on the CPU Inductor's C++ wrapper calls the
        # kernels without a Python line per kernel (a slower compile, a faster step).
        options = dict(mode="reduce-overhead") if self.cuda else dict(options={"cpp_wrapper": True})
        self._step = torch.compile(_step, fullgraph=True, dynamic=False, **options)
        started = time.perf_counter()
        with torch.inference_mode():
            for _ in range(3):  # a CUDA graph is recorded on the third call; Inductor compiles on the first
                self({})
        if self.cuda:
            torch.cuda.synchronize(cache.device)
        self.compile_seconds = time.perf_counter() - started

    def __call__(self, tokens: Mapping[int, int]) -> torch.Tensor:
        """Next-token logits (rows, vocab) after appending ``tokens[row]`` to each row it names;
        the other rows' logits are meaningless."""
        ids, slots = [0] * self.cache.batch_size, [self.spare] * self.cache.batch_size
        for row, token in tokens.items():
            ids[row], slots[row] = token, self.cache.lengths[row]
            assert slots[row] < self.spare, f"row {row} is full"
        device = self.cache.device
        logits = self._step(self.model, self.buffers, torch.tensor(ids, device=device).unsqueeze(1),
                            torch.tensor(slots, device=device))
        self.cache.count(list(tokens))
        # A CUDA graph's outputs are overwritten by its next replay.
        return logits.clone() if self.cuda else logits


def _step(model: GPT, buffers: tuple[torch.Tensor, ...], idx: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    # A spare slot sits past the last learned position: its junk token borrows the last one.
    positions = slots.clamp(max=model.config.block_size - 1).unsqueeze(1)
    return model.logits(model.hidden_states(idx, positions, StaticStep(buffers, slots))[:, -1])
