"""Shared settings for the membership attack tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Attack loops are small batched forward passes: on shared cores one intra-op thread is
    many times faster than an OpenMP pool; the setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
