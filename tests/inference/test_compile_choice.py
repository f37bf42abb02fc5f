"""When a command compiles its decode step (``inference.compiled_step.choose_compile``): only when
``--compile`` asks, on every device (docs/serving.md says why the server does not yet choose it on
CUDA); the flag is refused in one line where the compile cannot run."""

from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from inference.compiled_step import choose_compile


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_default_never_compiles(device):
    assert choose_compile(None, device=torch.device(device)) is False


def test_the_flag_decides_both_ways():
    assert choose_compile(True, device=torch.device("cuda")) is True
    assert choose_compile(False, device=torch.device("cuda")) is False


def test_compile_on_an_unsupported_device_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^torch.compile's decode step runs on cpu or cuda, not mps; drop --compile$"):
        choose_compile(True, device=torch.device("mps"))
