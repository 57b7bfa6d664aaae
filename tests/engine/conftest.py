"""Fixtures of the in-process training tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Train on one thread: the tiny models gain nothing from more, and on a shared 2-core machine two threads
    that wait for each other made a 90-step run take 50 s instead of 8 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
