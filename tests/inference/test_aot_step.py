"""The decode step built ahead of time (``inference.aot_step``), what ``--compile`` runs on the CPU: its
package is kept under a key of everything it depends on, loaded when valid and built again when not.
Its decoding is test_compiled_step.py's; both share the session's package (tests/conftest.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from inference.aot_step import CACHE_ENV, AotStep, aot_missing, cache_folder, package_key
from inference.compiled_step import CompiledStep, compiler_missing, spare_slot_cache
from inference.engine import Engine, decode
from inference.sampling import SamplingSettings
from model.kv_cache import KVCache
from signal_testkit import ROOT

pytestmark = pytest.mark.skipif(compiler_missing(torch.device("cpu")) is not None or aot_missing(torch.device("cpu")),
                                reason=str(compiler_missing(torch.device("cpu")) or aot_missing(torch.device("cpu"))))

PROMPT_IDS = [5, 17, 9, 30, 2, 11]


def one_row_step(model) -> AotStep:
    return AotStep(model, spare_slot_cache(model, 1, whole_buffers=False), exact_window=True)


@pytest.fixture(scope="session")
def package(loaded_run):
    """The session's one-row package, built on one thread (a session fixture precedes the per-test one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return one_row_step(loaded_run.model).package
    finally:
        torch.set_num_threads(threads)


def test_the_cpu_engine_runs_the_package_and_the_next_step_loads_it(loaded_run, package):
    engine = Engine(loaded_run.model, max_batch=1, batch_invariant=False, compile=True)
    assert isinstance(engine.compiled, AotStep) and engine.compiled.package == package
    settings = SamplingSettings(max_new_tokens=80, temperature=0)  # past the window (32): it slides
    [compiled] = decode(loaded_run.model, [PROMPT_IDS], settings, compile=True)
    [eager] = decode(loaded_run.model, [PROMPT_IDS], settings)
    assert compiled.token_ids == eager.token_ids and len(set(eager.token_ids)) > 10
    # A built package is loaded by the next step, not built again.
    step = one_row_step(loaded_run.model)
    assert step.package == package and not step.built and step.notice.startswith("loaded the decode step built ")
    record = json.loads(package.with_suffix(".json").read_text())
    assert record["digest"] == package.stem and record["threads"] == torch.get_num_threads()


def test_the_key_changes_with_everything_the_package_depends_on(loaded_run, monkeypatch):
    model = loaded_run.model
    one_row = spare_slot_cache(model, 1, whole_buffers=False)

    def digest(model=model, cache=one_row, exact_window=True) -> str:
        return package_key(model, cache, exact_window)["digest"]

    other_weights = type(model)(model.config).eval()
    other_weights.load_state_dict(model.state_dict())
    assert digest(other_weights) == digest()  # the same weights, another object: the same package
    with torch.no_grad():
        other_weights.lm_head.weight[3, 5] += 1e-3
    keys = {digest(), digest(other_weights), digest(cache=spare_slot_cache(model, 2, whole_buffers=False)),
            digest(exact_window=False), digest(cache=KVCache(  # the same rows, in bf16
                model.config.n_layer, 1, one_row.max_len, model.cache_entries(), dtype=torch.bfloat16))}
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    keys.add(digest())
    monkeypatch.undo()
    torch.set_num_threads(2)  # the fixture puts back one thread
    keys.add(digest())
    assert len(keys) == 7


@pytest.fixture
def private_cache(tmp_path, monkeypatch, package):
    """An empty cache folder, and a builder that copies the session's package in and counts its calls."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    builds: list[str] = []

    def build(step: AotStep, key: dict) -> None:
        builds.append(key["digest"])
        step.package.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package, step.package)
        record = json.loads(package.with_suffix(".json").read_text())
        step.package.with_suffix(".json").write_text(json.dumps({**record, **key}))

    monkeypatch.setattr(AotStep, "_build", build)
    return builds


def place(package, digest: str, *, damage: bool = False, record: bool = True) -> None:
    target = cache_folder() / f"{digest}.pt2"
    target.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray(package.read_bytes())
    if damage:
        data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    if record:
        shutil.copyfile(package.with_suffix(".json"), target.with_suffix(".json"))


@pytest.mark.parametrize("flaw", [None, "a flipped byte", "no checksum record"])
def test_a_valid_package_is_loaded_and_a_damaged_one_built_again(loaded_run, package, private_cache, flaw):
    place(package, package.stem, damage=flaw == "a flipped byte", record=flaw != "no checksum record")
    step = one_row_step(loaded_run.model)
    if flaw is None:
        assert not step.built and private_cache == []
        return
    assert step.built and private_cache == [package.stem] and step.notice.startswith("built the decode step in ")
    assert step.package.read_bytes() == package.read_bytes()  # what the builder wrote replaced it


def test_a_package_of_other_weights_under_this_key_is_not_trusted(loaded_run, package, private_cache):
    """Its checksum holds, but its logits are another model's: the step checks them against eager."""
    model = type(loaded_run.model)(loaded_run.model.config).eval()
    model.load_state_dict(loaded_run.model.state_dict())
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # tied: the embedding too
    digest = package_key(model, spare_slot_cache(model, 1, whole_buffers=False), True)["digest"]
    place(package, digest)
    with pytest.raises(UserError, match="does not match the eager step; drop --compile"):
        one_row_step(model)  # the stand-in builder writes the same wrong package again
    assert private_cache == [digest]


@pytest.mark.parametrize("flaw", ["the package writer aborts", "the folder cannot be made"])
def test_a_build_that_cannot_write_its_package_is_one_line_and_leaves_nothing(loaded_run, monkeypatch, tmp_path, flaw):
    """A full disk aborts AOTInductor's package writer (SIGABRT): only the build's own process dies."""
    folder = tmp_path / "cache"
    if flaw == "the package writer aborts":  # it wrote part of the package first
        real = subprocess.Popen
        abort = "import os, sys; open(sys.argv[2], 'wb').write(b'part'); os.abort()"
        monkeypatch.setattr("inference.aot_step.subprocess.Popen",
                            lambda command, **kw: real([sys.executable, "-c", abort, *command[3:]], **kw))
        what = "its process ended with exit code -6"
    else:
        tmp_path.joinpath("a-file").write_text("mine")
        folder = tmp_path / "a-file" / "cache"
        what = "Not a directory"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    with pytest.raises(UserError) as info:
        one_row_step(loaded_run.model)
    message = str(info.value)
    assert message.startswith(f"cannot build the compiled decode step in {folder} (") and what in message
    assert message.endswith(f"); if its disk is full, free space there or point ${CACHE_ENV} at another folder; "
                            "or drop --compile") and "\n" not in message
    assert not folder.is_dir() or list(folder.iterdir()) == []


def _builders(folder: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        if b"inference.aot_step" in words and any(str(folder).encode() in word for word in words):
            found.append(cmdline.parent.name)
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.e2e)])
def test_a_signal_during_the_build_stops_it_at_once_and_leaves_no_package(run_dir, tmp_path, signum):
    folder = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "generate.py", "--run", str(run_dir), "--compile", "--prompt", "x"], cwd=ROOT,
        env={**os.environ, CACHE_ENV: str(folder)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # a group of its own, signalled whole as a terminal's Ctrl-C is
    deadline = time.monotonic() + 120  # the exported step is written just before its compile starts
    while not any(f.stat().st_size for f in folder.glob(".*.export.*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2)  # on into the build: wherever it is by then (its process starting, or compiling), it stops
    os.killpg(process.pid, signum)
    try:
        err = process.communicate(timeout=120)[1]
    finally:
        process.kill()
    code = process.returncode
    assert code == 128 + signum and "Traceback" not in err, err[-2000:]
    assert list(folder.iterdir()) == [] and _builders(folder) == []


def test_the_cache_folder_and_where_the_step_is_built_ahead_of_time(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_folder() == tmp_path
    monkeypatch.delenv(CACHE_ENV)
    assert str(cache_folder()) == "compile_cache"
    # The step is built ahead of time on the CPU only, and from torch 2.6.
    assert aot_missing(torch.device("cpu")) is None
    assert aot_missing(torch.device("cuda")) == "the ahead-of-time step runs on the CPU, not cuda"
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.5.1"))
    assert aot_missing(torch.device("cpu")) == "AOTInductor needs torch 2.6 or later, this is 2.5.1"


def test_without_aotinductor_the_engine_compiles_with_torch_compile(loaded_run, monkeypatch):
    """The fallback (a torch before 2.6): today's torch.compile step, equal to eager as before."""
    monkeypatch.setattr("inference.aot_step.aot_missing", lambda device: "no AOTInductor here")
    engine = Engine(loaded_run.model, max_batch=1, batch_invariant=False, compile=True)
    assert isinstance(engine.compiled, CompiledStep)
    settings = SamplingSettings(max_new_tokens=40, temperature=0.9, seed=4)
    [compiled] = decode(loaded_run.model, [PROMPT_IDS], settings, compile=True)
    [eager] = decode(loaded_run.model, [PROMPT_IDS], settings)
    assert compiled.token_ids == eager.token_ids
