"""Fixtures every test directory may use. Its presence also puts ``tests/`` on the path, so the
shared builders import as ``run_testkit``."""

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core machine: a second intra-op thread mostly waits for the first,
    so run single-threaded and restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
