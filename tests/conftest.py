"""Shared test setup: one torch thread (CI has 2 shared cores), deterministic seeds."""

import os
from collections.abc import Iterator

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    torch.manual_seed(0)
    yield
    torch.set_num_threads(1)  # a test that tuned threads (torch_threads=auto) leaves one
