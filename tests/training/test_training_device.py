"""Device, precision and compile choices."""

from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from training.device import autocast, resolve_precision, select_device, should_compile


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
