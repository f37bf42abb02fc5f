"""Fixtures for the run-directory tests: tiny models on one thread."""

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread):
    yield
