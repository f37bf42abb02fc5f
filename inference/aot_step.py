"""The CPU's compiled decode step, built ahead of time: no Python between its kernels, nor around them.

``torch.compile``'s step (``inference.compiled_step``) still passes through Python on every token,
and at one row ATen's general matrix product reads a small model's weights slowly. AOTInductor
removes both: ``torch.export`` captures ``compiled_step.step_logits``,
``torch._inductor.aoti_compile_and_package`` compiles it into one ``.pt2`` package, and
``aoti_load_package`` calls it through one C++ entry point. ``freezing`` treats the weights as
constants (the AOTInductor tutorial's advice for the CPU), and ``max_autotune`` with the ``CPP`` GEMM
backend writes each matrix product for its own shapes and packed weights: that is what makes it fast.

The package fixes the weights, the cache's shape, batch invariance or a symbolic window, the torch
version, the CPU's vector instructions and the thread count. Building takes tens of seconds (in a
child process, so a signal or a full disk takes only the child), so the package is kept on disk,
named by a hash of all of them and of the step's source files (``cache_folder``; delete it at any
time). It is written atomically with its checksum beside it; one that fails its checksum, fails to
load, or whose first logits differ from the eager step's is built again, never used.

Without AOTInductor (torch older than ``MIN_TORCH``) or off the CPU (a GPU replays ``torch.compile``'s
CUDA graph, already free of Python), ``decode_step`` returns ``torch.compile``'s step instead."""

import contextlib
import functools
import hashlib
import inspect
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from common.errors import UserError, describe_os_error
from common.files import atomic_output, atomic_write_text
from inference.batch_invariant import RowBlockedLinear
from inference.compiled_step import MIN_WINDOW, CompiledStep, step_inputs, step_logits
from model.gpt import GPT
from model.kv_cache import KVCache

MIN_TORCH = (2, 6)  # the first with AOTInductor's package API:
AOTI_API = ("aoti_compile_and_package", "aoti_load_package")
CACHE_ENV = "MINIGPT_COMPILE_CACHE"
DEFAULT_CACHE = "compile_cache"
INDUCTOR_OPTIONS = {"max_autotune": True, "freezing": True}
# The C++ GEMM template alone first, skipping minutes of timing it against ATen's product (which it
# always beat); a product it does not cover (latent attention's rotary scores) then builds with both.
GEMM_BACKENDS = ("CPP", "CPP,ATEN")
# The first logits of a package must match the eager step's this closely: a package of other weights
# or another model misses by far more, while a kernel that only sums in another order stays inside.
CHECK_TOLERANCE = 1e-3
# The files whose code the package was traced from: a change to any of them is a new package.
_SOURCES = (inspect.getfile(GPT), inspect.getfile(KVCache), inspect.getfile(RowBlockedLinear),
            inspect.getfile(CompiledStep), __file__)


def aot_missing(device: torch.device) -> str | None:
    """Why the ahead-of-time step cannot run on ``device``, or None when it can."""
    if device.type != "cpu":
        return f"the ahead-of-time step runs on the CPU, not {device.type}"
    if torch.__version__ < MIN_TORCH or not all(hasattr(torch._inductor, name) for name in AOTI_API):
        return f"AOTInductor needs torch {'.'.join(map(str, MIN_TORCH))} or later, this is {torch.__version__}"
    return None


def decode_step(model: GPT, cache: KVCache, *, exact_window: bool = False) -> "AotStep | CompiledStep":
    """The compiled decode step for ``cache``: built ahead of time on the CPU, ``torch.compile``'s
    elsewhere or on a torch without AOTInductor."""
    if aot_missing(cache.device) is None:
        return AotStep(model, cache, exact_window=exact_window)
    return CompiledStep(model, cache, exact_window=exact_window)


def cache_folder() -> Path:
    """Where packages are kept: $MINIGPT_COMPILE_CACHE, else compile_cache/ in the working directory."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


class AotStep:
    """``CompiledStep``'s interface over a package for ``model`` and ``cache``, loaded from
    ``cache_folder()`` when a valid one is there, else built and kept there (``built``)."""

    def __init__(self, model: GPT, cache: KVCache, *, exact_window: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.buffers = tuple(cache.buffers.values())
        self.spare = cache.max_len - 1
        self._window = torch.empty(self.spare) if exact_window and self.spare > MIN_WINDOW else None
        started = time.perf_counter()
        key = package_key(model, cache, self._window is not None)
        self.package = cache_folder() / f"{key['digest']}.pt2"
        self._runner = self._load()
        self.built = self._runner is None
        if self._runner is None:
            self._build(key)
            self._runner = self._load()
            if self._runner is None:
                raise UserError(f"the decode step built ahead of time in {self.package} does not match the "
                                "eager step; drop --compile")
        self.compile_seconds = time.perf_counter() - started

    @property
    def notice(self) -> str:
        """The one line a command prints about this step: built now, or loaded as built before."""
        if self.built:
            return (f"built the decode step in {self.compile_seconds:.1f} s and kept it in {self.package.parent} "
                    "for the next run of these weights (--no-compile skips it)")
        return f"loaded the decode step built before in {self.compile_seconds:.1f} s (--no-compile skips it)"

    def __call__(self, tokens: Mapping[int, int]) -> torch.Tensor:
        """Next-token logits (rows, vocab) after appending ``tokens[row]`` to each row it names;
        the other rows' logits are meaningless."""
        logits = self._runner(*self._arguments(tokens))
        self.cache.count(list(tokens))
        return logits

    def _arguments(self, tokens: Mapping[int, int]) -> tuple:
        return (self.buffers, *step_inputs(self.cache, tokens, self._window))

    def _build(self, key: dict) -> None:
        """Export the step, compile it into the package in a child process (``_compile_apart``), and
        write its checksum beside it. A folder that cannot take them (a full disk) is one line."""
        arguments = self._arguments({})
        window = torch.export.Dim("window", min=MIN_WINDOW, max=self.spare)
        shapes = ((None,) * len(self.buffers), None, None, None if self._window is None else {0: window})
        with torch.no_grad(), _without_torchs_own_warning():
            program = torch.export.export(_Step(self.model), arguments, dynamic_shapes=shapes)
        folder = self.package.parent
        try:
            with atomic_output(self.package, suffix=".pt2") as written:
                fd, exported = tempfile.mkstemp(prefix=f".{self.package.stem}.export.", suffix=".pt2", dir=folder)
                os.close(fd)
                try:
                    torch.export.save(program, exported)
                    _compile_apart(Path(exported), written)
                finally:
                    os.unlink(exported)
            atomic_write_text(self.package.with_suffix(".json"),
                              json.dumps({**key, "sha256": _file_digest(self.package)}, indent=1) + "\n")
        except (OSError, _BuildFailed) as error:
            what = describe_os_error(error) if isinstance(error, OSError) else str(error)
            raise UserError(f"cannot build the compiled decode step in {folder} ({what}); if its disk is full, "
                            f"free space there or point ${CACHE_ENV} at another folder; or drop --compile") from None

    def _load(self):
        """The package's runner, or None when it is missing, damaged, or not this model's step."""
        try:
            record = json.loads(self.package.with_suffix(".json").read_text())
            if record.get("sha256") != _file_digest(self.package):
                return None
            with _without_torchs_own_warning():
                runner = torch._inductor.aoti_load_package(str(self.package))
        except Exception:  # unreadable, not JSON, not a package: whatever the reason, build it again
            return None
        return runner if self._agrees(runner) else None

    def _agrees(self, runner) -> bool:
        """Whether ``runner``'s logits for a first token equal the eager step's, within
        ``CHECK_TOLERANCE``. Both write the empty cache's first slot, which nothing has counted yet."""
        assert not any(self.cache.lengths), "the step is checked before its cache holds anything"
        probe = {row: row % self.model.config.vocab_size for row in range(self.cache.batch_size)}
        arguments = self._arguments(probe)
        with torch.inference_mode():
            eager = step_logits(self.model, *arguments)
            try:
                compiled = runner(*arguments)
            except RuntimeError:
                return False
        return compiled.shape == eager.shape and bool(torch.allclose(compiled, eager, rtol=0, atol=CHECK_TOLERANCE))


class _BuildFailed(Exception):
    """The child process that compiles the package failed; the message says how."""


def _compile_apart(exported: Path, package: Path) -> None:
    """AOTInductor's compile of the exported step into ``package``, in a child process
    (``python -m inference.aot_step``) that a signal stops at once with its compilers, and whose
    abort (a full disk under the package writer) takes only itself."""
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path if isinstance(entry, str))
    with tempfile.TemporaryFile() as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", "inference.aot_step", str(exported), str(package), str(torch.get_num_threads())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
            env={**os.environ, "PYTHONPATH": path})
        try:
            code = child.wait()
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)  # the child and the compilers it started
            child.wait()
            raise
        errors.seek(0)
        said = [line for line in errors.read().decode("utf-8", "replace").splitlines() if line.startswith("error: ")]
    if code != 0:
        raise _BuildFailed(said[-1].removeprefix("error: ") if said else f"its process ended with exit code {code}")


def _build_package(exported: str, package: str, threads: str) -> int:
    """The child's side of ``_compile_apart``: load the exported step and compile it into ``package``."""
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(int(threads))  # the package's loops are cut for the parent's thread count
    try:
        with _without_torchs_own_warning():
            program = torch.export.load(exported)
            for backends in GEMM_BACKENDS:
                options = {**INDUCTOR_OPTIONS, "max_autotune_gemm_backends": backends}
                try:
                    torch._inductor.aoti_compile_and_package(program, package_path=package, inductor_configs=options)
                    return 0
                except Exception:  # Inductor's own error types are private: the wider build says what failed
                    if backends == GEMM_BACKENDS[-1]:
                        raise
    except Exception as error:  # noqa: BLE001 - one line for the parent to show
        message = str(error).strip().splitlines()
        print(f"error: {type(error).__name__}: {message[-1] if message else ''}", file=sys.stderr)
    return 1


def _exit_with_parent(parent: int) -> None:
    """End the child when the command that started it is gone (killed before it could stop the child)."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


@contextlib.contextmanager
def _without_torchs_own_warning() -> Iterator[None]:
    """torch's export and AOTInductor code trips torch's own ``FutureWarning: isinstance(treespec,
    LeafSpec) is deprecated`` on every build and load: nothing a user of --compile can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        yield


class _Step(nn.Module):
    """``step_logits`` as a module over ``model``, which is what ``torch.export`` takes."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, buffers: tuple[torch.Tensor, ...], idx: torch.Tensor, slots: torch.Tensor,
                window: torch.Tensor | None) -> torch.Tensor:
        return step_logits(self.model, buffers, idx, slots, window)


def package_key(model: GPT, cache: KVCache, exact_window: bool) -> dict:
    """Everything a package depends on, and its hash (``digest``), which names it."""
    weights = hashlib.sha256()
    for name, tensor in model.state_dict(keep_vars=False).items():
        weights.update(name.encode())
        weights.update(str((tensor.dtype, tuple(tensor.shape))).encode())
        weights.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    key = {
        "config": model.config.to_dict(),
        "row_blocked": any(isinstance(m, RowBlockedLinear) for m in model.modules()),
        "weights": weights.hexdigest(),
        "cache": {name: list(buffer.shape) for name, buffer in cache.buffers.items()},
        "dtype": str(cache.buffers[next(iter(cache.buffers))].dtype),
        "exact_window": exact_window,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "inductor": {**INDUCTOR_OPTIONS, "gemm": GEMM_BACKENDS},
        "sources": _sources_digest(),
    }
    key["digest"] = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return key


@functools.cache
def _sources_digest() -> str:
    """The hash of the step's source files, as this process imported them."""
    digest = hashlib.sha256()
    for source in _SOURCES:
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


if __name__ == "__main__":
    sys.exit(_build_package(*sys.argv[1:]))
