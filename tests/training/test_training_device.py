"""Device, precision and compile choices."""

import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import training.device as device_module
from common.errors import UserError
from common.device import select_device
from training.device import autocast, configure_backends, precision_name, resolve_precision, should_compile
from training.resume_rules import run_precision


def test_explicit_cpu_and_auto():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert select_device("cpu") == torch.device("cpu") and select_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_cuda_is_a_user_error():
    with pytest.raises(UserError, match="CUDA is not available"):
        select_device("cuda")


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_picks_bf16_on_a_cpu_with_bf16_dot_products_and_either_can_be_forced(monkeypatch, has_bf16):
    monkeypatch.setattr(device_module, "cpu_has_bf16_dot_products", lambda: has_bf16)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == (torch.bfloat16 if has_bf16 else torch.float32)
    assert (resolve_precision("bf16", cpu), resolve_precision("fp32", cpu)) == (torch.bfloat16, torch.float32)
    # A resumed run: auto keeps the precision it trained in; an explicit setting changes it.
    for own in ("fp32", "bf16"):
        assert precision_name(resolve_precision("auto", cpu, run_own=own)) == own
        assert (resolve_precision("fp32", cpu, run_own=own), resolve_precision("bf16", cpu, run_own=own)) == (
            torch.float32, torch.bfloat16)


@pytest.mark.parametrize("setting, run_own, expected", [
    ("auto", None, torch.float32), ("auto", "fp32", torch.float32),
    ("bf16", None, r"^train.precision=bf16 but this GPU has no bf16 support; use --set train.precision=fp32$"),
    ("auto", "bf16", r"^train.precision=auto resumes the run's own bf16, but this GPU has no bf16 support; use "
                     r"--set train.precision=fp32$"),
])
def test_a_gpu_without_bf16_refuses_it_in_one_line_even_as_a_runs_own(monkeypatch, setting, run_own, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(UserError, match=expected) if isinstance(expected, str) else nullcontext():
        assert resolve_precision(setting, torch.device("cuda"), run_own=run_own) == expected
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16  # as before CPUs could choose bf16


def test_a_run_without_a_saved_precision_resumes_as_auto_chose_then():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert run_precision(None, cpu) is None  # a new run
    assert (run_precision({"precision": "bf16"}, cpu), run_precision({"precision": "fp32"}, gpu)) == ("bf16", "fp32")
    # Saved before the precision was: auto was fp32 on every CPU, and chose on a GPU as it does now.
    assert (run_precision({}, cpu), run_precision({}, gpu)) == ("fp32", None)


@pytest.mark.parametrize("capabilities, expected", [
    ({"avx512_bf16": True, "amx_bf16": False}, True),  # AMD Zen 4, Intel Cooper Lake
    ({"avx512_bf16": True, "amx_bf16": True}, True),  # Intel Sapphire Rapids
    ({"avx512_bf16": False, "amx_bf16": False, "avx512_f": True, "avx2": True}, False),
    ({"architecture": "arm64", "bf16": True}, False),  # oneDNN's bf16 path on x86 is what auto knows
])
def test_the_cpu_is_asked_through_torch(monkeypatch, capabilities, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities, raising=False)
    assert device_module.cpu_has_bf16_dot_products() is expected


def test_without_torchs_answer_the_linux_kernel_is_asked(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 "
                    "avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert device_module.linux_cpu_flags(str(info)) >= {"avx512_bf16", "avx2"}
    assert device_module.linux_cpu_flags(str(tmp_path / "absent")) == set()  # not Linux
    for flags, expected in [({"avx2", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True),
                            ({"avx2", "avx512f"}, False), (set(), False)]:
        monkeypatch.setattr(device_module, "linux_cpu_flags", lambda flags=flags: flags)
        assert device_module.cpu_has_bf16_dot_products() is expected


@pytest.mark.skipif("avx512_bf16" not in device_module.linux_cpu_flags(), reason="needs a CPU whose kernel "
                    "reports avx512_bf16")
def test_on_a_cpu_with_avx512_bf16_auto_trains_in_bf16():
    # This host, unpatched: torch's answer (or the kernel's) must see what the kernel reports.
    assert resolve_precision("auto", torch.device("cpu")) == torch.bfloat16


def test_cpu_compiles_only_when_asked_and_autocast_is_a_no_op_in_fp32(monkeypatch, capsys):
    cpu = torch.device("cpu")
    assert (should_compile("auto", cpu), should_compile(True, cpu), should_compile("auto", torch.device("cuda"))) == (
        False, True, True)
    for dtype in (torch.float32, torch.bfloat16):
        with autocast(cpu, dtype):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
    # Without a C++ compiler the CPU trains uncompiled, and says why.
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert should_compile(True, torch.device("cpu")) is False and "no C++ compiler" in capsys.readouterr().err
    # A GPU compiles with Triton, not the host C++ compiler: the setting stands.
    assert should_compile(True, torch.device("cuda")) is True


# Runs in a fresh interpreter: the allocator settings are process-wide and cannot be undone.
_PAGE_FAULT_PROBE = """
import resource, torch
import torch.nn.functional as F
from training.device import keep_freed_memory

x = torch.randn(16, 128, 128, requires_grad=True)
weight = torch.ones(128, requires_grad=True)
grad = torch.randn(16, 128, 128)

def faults_per_step():
    for _ in range(5):
        F.rms_norm(x, (128,), weight).backward(grad)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        F.rms_norm(x, (128,), weight).backward(grad)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50

default = faults_per_step()
accepted = keep_freed_memory()
print(default, accepted, faults_per_step())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings")
def test_keeping_freed_memory_stops_per_step_page_faults():
    # One 1 MiB activation is 256 pages; a forward and backward allocates several of them.
    out = subprocess.run([sys.executable, "-c", _PAGE_FAULT_PROBE], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    default, accepted, kept = out.stdout.split()
    if accepted != "True":
        pytest.skip("the C library is not glibc; keep_freed_memory() is a no-op there")
    if float(default) < 256:
        pytest.skip(f"this allocator already reuses freed memory ({default} page faults per step)")
    assert float(kept) < float(default) / 10, (default, kept)


def test_configure_backends_on_the_cpu_keeps_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(device_module, "keep_freed_memory", lambda: calls.append(1) or True)
    configure_backends(torch.device("cpu"))
    assert calls == [1]
