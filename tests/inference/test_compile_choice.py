"""When a command compiles its decode step (``inference.compiled_step.choose_compile``): a server
on CUDA by default, where it pays; every other command, and a server on the CPU, only when
``--compile`` asks. The flag wins both ways, and is refused in one line where the compile cannot run."""

from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from inference.compiled_step import choose_compile


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_one_generation_or_chat_never_compiles_by_default(device):
    assert choose_compile(None, device=torch.device(device)) is False


def test_a_server_compiles_by_default_on_cuda_only(monkeypatch):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: True)
    assert choose_compile(None, device=torch.device("cuda"), serving=True) is True
    assert choose_compile(None, device=torch.device("cpu"), serving=True) is False
    assert choose_compile(None, device=torch.device("mps"), serving=True) is False


def test_the_default_never_compiles_without_the_cache(monkeypatch):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: True)
    assert choose_compile(None, use_cache=False, device=torch.device("cuda"), serving=True) is False


def test_without_triton_a_cuda_server_stays_eager_and_compile_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: False)
    assert choose_compile(None, device=torch.device("cuda"), serving=True) is False
    with pytest.raises(UserError, match=r"^torch.compile on CUDA needs Triton \(pip install triton\); drop --compile$"):
        choose_compile(True, device=torch.device("cuda"), serving=True)


@pytest.mark.parametrize("serving", [False, True])
def test_the_flag_decides_both_ways(serving, monkeypatch):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: True)
    assert choose_compile(True, device=torch.device("cuda"), serving=serving) is True
    assert choose_compile(False, device=torch.device("cuda"), serving=serving) is False


def test_compile_on_an_unsupported_device_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^torch.compile's decode step runs on cpu or cuda, not mps; drop --compile$"):
        choose_compile(True, device=torch.device("mps"))


def test_compile_without_the_cache_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^--compile compiles the cached decode step; drop --no-cache or --compile$"):
        choose_compile(True, use_cache=False, device=torch.device("cpu"))
