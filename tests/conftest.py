"""Test-wide settings: hypothesis runs the same examples every time, so CI is reproducible, and
every test starts with torch's default thread count (floating-point sums depend on it)."""

from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

settings.register_profile("privacylab", derandomize=True, print_blob=True)
settings.load_profile("privacylab")

DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _default_torch_threads() -> Iterator[None]:
    torch.set_num_threads(DEFAULT_THREADS)
    yield
    torch.set_num_threads(DEFAULT_THREADS)
