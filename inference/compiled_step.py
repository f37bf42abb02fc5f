"""The compiled decode step: one token for every row of the engine's cache, in one graph.

This is ``torch.compile``'s step: a GPU's (one CUDA graph per step, mode ``reduce-overhead``), and the
CPU's on a torch without AOTInductor; elsewhere on the CPU the same ``step_logits`` is built ahead of
time (``inference.aot_step``). Eager decoding at batch 1 spends most of a step in Python and dispatch.

Compiling needs fixed shapes, so the step always runs every row of the cache under a mask
(``StaticStep``): positions and which rows decode are tensors, and a generation of any length
compiles once. A row with nothing to decode writes a spare slot past ``block_size`` that no mask lets
anyone read, and its logits are dropped. A server's rows read the whole buffer (batch invariance, and
a CUDA graph needs the static shape); otherwise on the CPU rows read only up to the longest row's
slot (``exact_window``), a symbolic size, so a short generation does not attend over every slot.

Guards cost little beside the step, so PyTorch's knobs for skipping them gain nothing here. Prompts
are encoded eagerly: a compile per length would cost more than it saves. The eager path stays the
reference (tests/inference/test_compiled_step.py bounds the difference in the last bits)."""

import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Mapping

import torch

from common.errors import UserError
from model.gpt import GPT
from model.kv_cache import KVCache, StaticStep

def choose_compile(flag: bool | None, *, use_cache: bool = True, device: torch.device, serving: bool = False) -> bool:
    """Whether a command compiles its decode step: as ``flag`` says when given (refusing in one line a
    compile that cannot run), else only a server on CUDA, which soon repays the compile (docs/results.md,
    "A GPU: small.yaml and the compiled decode step"); one generation, or a CPU server, does not."""
    if flag is None:
        return serving and device.type == "cuda" and use_cache and compiler_missing(device) is None
    if flag and not use_cache:
        raise UserError("--compile compiles the cached decode step; drop --no-cache or --compile")
    reason = compiler_missing(device) if flag else None
    if reason is not None:
        raise UserError(f"{reason}; drop --compile")
    return flag


def compiler_missing(device: torch.device) -> str | None:
    """Why a compiled step cannot run on ``device``, or None when it can."""
    if device.type == "cuda":
        return None if _triton_installed() else "torch.compile on CUDA needs Triton (pip install triton)"
    if device.type != "cpu":
        return f"torch.compile's decode step runs on cpu or cuda, not {device.type}"
    # Inductor runs $CXX when it is set, else its platform's default, and no other.
    compiler = os.environ.get("CXX", {"darwin": "clang++", "win32": "cl"}.get(sys.platform, "g++"))
    if not compiler or shutil.which(compiler) is None:
        source = "$CXX" if "CXX" in os.environ else "its default; $CXX chooses another"
        return f"torch.compile needs a C++ compiler on the CPU: {compiler!r} ({source}) was not found"
    return None


def _triton_installed() -> bool:
    """Inductor writes a GPU's kernels in Triton, which torch's Linux CUDA wheels bring along."""
    return importlib.util.find_spec("triton") is not None


def spare_slot_cache(model: GPT, rows: int, whole_buffers: int) -> KVCache:
    """A cache of ``rows`` rows of block_size positions plus the spare slot idle rows write."""
    weight = model.tok_emb.weight
    return KVCache(model.config.n_layer, rows, model.config.block_size + 1, model.cache_entries(),
                   device=weight.device, dtype=weight.dtype, whole_buffers=whole_buffers)


class CompiledStep:
    """The decode step over every row of ``cache`` (made by ``spare_slot_cache``), compiled for
    ``model`` when built; ``exact_window``: rows read only up to the longest decoding row's slot."""

    def __init__(self, model: GPT, cache: KVCache, *, exact_window: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.buffers = tuple(cache.buffers.values())
        self.spare = cache.max_len - 1
        self.cuda = cache.device.type == "cuda"
        if self.cuda:  # the graph writes the cache in place: its address must not change
            for buffer in self.buffers:
                torch._dynamo.mark_static_address(buffer)
        # Only a tensor's length can reach the graph as a symbolic size (an int would be compiled
        # in as a constant): the window is passed as a slice of this one, never read.
        self._window = torch.empty(self.spare, device=cache.device) if exact_window and self.spare > MIN_WINDOW else None
        # On a GPU the step replays as a CUDA graph; on the CPU Inductor's C++ wrapper calls the
        # kernels without a Python line per kernel (a slower compile, a faster step).
        options = dict(mode="reduce-overhead") if self.cuda else dict(options={"cpp_wrapper": True})
        self._step = torch.compile(step_logits, fullgraph=True, dynamic=False, **options)
        started = time.perf_counter()
        self._warm = False
        with torch.inference_mode():
            for _ in range(3):  # a CUDA graph is recorded on the third call; Inductor compiles on the first
                self({})
                self._warm = True
        if self.cuda:
            torch.cuda.synchronize(cache.device)
        self.compile_seconds = time.perf_counter() - started

    built = True  # torch.compile keeps nothing for the next process

    @property
    def notice(self) -> str:
        """The one line a command prints about this step."""
        return f"built the decode step in {self.compile_seconds:.1f} s (once per process; --no-compile skips it)"

    def __call__(self, tokens: Mapping[int, int]) -> torch.Tensor:
        """Next-token logits (rows, vocab) after appending ``tokens[row]`` to each row it names;
        the other rows' logits are meaningless."""
        logits = self._step(*self._arguments(tokens))
        self.cache.count(list(tokens))
        # A CUDA graph's outputs are overwritten by its next replay.
        return logits.clone() if self.cuda else logits

    def _arguments(self, tokens: Mapping[int, int]) -> tuple:
        """``step_logits``' arguments for one step."""
        idx, slots, window = step_inputs(self.cache, tokens, self._window)
        if window is not None and not self._warm:
            torch._dynamo.mark_dynamic(window, 0, min=MIN_WINDOW, max=self.spare)
        return self.model, self.buffers, idx, slots, window


MIN_WINDOW = 2


def step_inputs(cache: KVCache, tokens: Mapping[int, int],
                window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``step_logits``' per-step inputs for ``cache``'s rows (idx, slots, window): ``tokens[row]``
    at each named row's length, the others at the spare slot; the window, a slice of ``window``
    (None: every slot) as long as the longest named row needs."""
    spare = cache.max_len - 1
    ids, slots = [0] * cache.batch_size, [spare] * cache.batch_size
    for row, token in tokens.items():
        ids[row], slots[row] = token, cache.lengths[row]
        assert slots[row] < spare, f"row {row} is full"
    if window is not None:
        # At least two slots: a size of 0 or 1 would be compiled as a constant of its own.
        window = window[:max([MIN_WINDOW - 1, *(slots[row] for row in tokens)]) + 1]
    device = cache.device
    return torch.tensor(ids, device=device).unsqueeze(1), torch.tensor(slots, device=device), window


def step_logits(model: GPT, buffers: tuple[torch.Tensor, ...], idx: torch.Tensor, slots: torch.Tensor,
                window: torch.Tensor | None) -> torch.Tensor:
    """The decode step every compiled path traces: each row's next-token logits after writing its
    token at its slot of ``buffers`` (``StaticStep``)."""
    # A spare slot sits past the last learned position: its junk token borrows the last one.
    positions = slots.clamp(max=model.config.block_size - 1).unsqueeze(1)
    span = None if window is None else window.shape[0]
    return model.logits(model.hidden_states(idx, positions, StaticStep(buffers, slots, span))[:, -1])
