"""Fixtures every test directory may use; its presence puts ``tests/`` on the path (``run_testkit``)."""

import subprocess
from pathlib import Path

import pytest
import torch

from inference.aot_step import CACHE_ENV


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One folder for the session's compiled decode steps, inherited by the processes tests start: a
    package built by one test is loaded by the next, and nothing lands in ./compile_cache/."""
    folder = tmp_path_factory.mktemp("compile_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(folder))
        yield folder


# Tiny models on a shared 2-core machine: a second intra-op thread mostly waits for the first, so the
# tests of these folders run single-threaded, and the setting is restored afterwards.
SINGLE_THREADED = {"evaluation", "exporting", "inference", "model", "rundir", "serving"}


@pytest.fixture(autouse=True)
def one_torch_thread(request):
    if request.path.relative_to(Path(__file__).parent).parts[0] not in SINGLE_THREADED:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs(size_bytes, read_only=False)`` -> a mounted directory, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: int, read_only: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'mount failed'})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture(scope="session")
def tool_run_dir(tmp_path_factory):
    """A tiny run that really calls the calculator (``run_testkit.build_tool_run``), trained once per session."""
    from run_testkit import build_tool_run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_tool_run(tmp_path_factory.mktemp("runs") / "tiny-tools")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tool_run(tool_run_dir):
    """``tool_run_dir`` loaded for decoding on the CPU."""
    from rundir.loading import load_run

    return load_run(tool_run_dir, torch.device("cpu"))


@pytest.fixture(scope="module")
def toolbox():
    """The calculator in its worker process, for tests that decode with tools."""
    from tools import Toolbox, load_tools

    with Toolbox(load_tools(["calculator"]), timeout_s=60) as tools:
        yield tools
