"""Device, precision and compile choices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import training.device as device_module
from common.errors import UserError
from common.device import select_device
from training.device import autocast, configure_backends, resolve_precision, should_compile


def test_explicit_cpu_and_auto():
    assert select_device("cpu") == torch.device("cpu")
    auto = select_device("auto")
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert auto.type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_cuda_is_a_user_error():
    with pytest.raises(UserError, match="CUDA is not available"):
        select_device("cuda")


def test_cpu_defaults_fp32_eager():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == torch.float32
    assert resolve_precision("bf16", cpu) == torch.bfloat16
    assert should_compile("auto", cpu) is False
    assert should_compile(True, cpu) is True
    assert should_compile("auto", torch.device("cuda")) is True
    with autocast(cpu, torch.float32):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with autocast(cpu, torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_compile_on_cpu_without_a_cxx_compiler_trains_uncompiled(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert should_compile(True, torch.device("cpu")) is False
    assert "no C++ compiler" in capsys.readouterr().err
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
