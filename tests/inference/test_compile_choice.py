"""When a command compiles its decode step, and its refusals where it cannot."""

import pytest
import torch

from common.errors import UserError
from inference.compiled_step import choose_compile


@pytest.mark.parametrize("flag, device, serving, use_cache, triton, compiles", [
    (None, "cpu", False, True, True, False), (None, "cuda", False, True, True, False),  # one generation or chat
    (None, "cuda", True, True, True, True), (None, "cpu", True, True, True, False),
    (None, "mps", True, True, True, False),
    (None, "cuda", True, False, True, False),  # the default never compiles without the cache
    (None, "cuda", True, True, False, False),  # nor without Triton
    (True, "cuda", False, True, True, True), (True, "cuda", True, True, True, True),
    (False, "cuda", False, True, True, False), (False, "cuda", True, True, True, False),
])
def test_the_default_and_the_flag_decide(monkeypatch, flag, device, serving, use_cache, triton, compiles):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: triton)
    assert choose_compile(flag, device=torch.device(device), serving=serving, use_cache=use_cache) is compiles


@pytest.mark.parametrize("device, use_cache, message", [
    ("cuda", True, r"^torch.compile on CUDA needs Triton \(pip install triton\); drop --compile$"),
    ("mps", True, r"^torch.compile's decode step runs on cpu or cuda, not mps; drop --compile$"),
    ("cpu", False, r"^--compile compiles the cached decode step; drop --no-cache or --compile$"),
])
def test_a_compile_that_cannot_run_is_refused_in_one_line(monkeypatch, device, use_cache, message):
    monkeypatch.setattr("inference.compiled_step._triton_installed", lambda: False)
    with pytest.raises(UserError, match=message):
        choose_compile(True, device=torch.device(device), use_cache=use_cache)
