"""When a command compiles its decode step (``inference.compiled_step.choose_compile``): the flag
decides when given; by default only a long-running command on CUDA does, where the CUDA-graph step
repays its compile (docs/results.md, "A GPU: small.yaml and the compiled decode step")."""

from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from inference.compiled_step import choose_compile

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("device, long_running, expected", [
    (CUDA, True, True),     # serve.py on a GPU
    (CUDA, False, False),   # one generation or a chat on a GPU
    (CPU, True, False),     # serve.py on the CPU: the C++ build costs tens of seconds
    (CPU, False, False),
])
def test_the_default_compiles_only_a_long_running_command_on_cuda(device, long_running, expected):
    assert choose_compile(None, device=device, long_running=long_running) is expected


def test_the_default_never_compiles_without_the_cache():
    assert choose_compile(None, use_cache=False, device=CUDA, long_running=True) is False


def test_the_flag_overrides_the_default_both_ways():
    assert choose_compile(False, device=CUDA, long_running=True) is False
    assert choose_compile(True, device=CUDA) is True


def test_compile_on_an_unsupported_device_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^torch.compile's decode step runs on cpu or cuda, not mps; drop --compile$"):
        choose_compile(True, device=torch.device("mps"))
