"""Shared test setup: one torch thread (CI has 2 shared cores), deterministic seeds."""

import os
import signal
from collections.abc import Iterator

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

# A script's background job (``pytest &``) starts with SIGINT ignored, and so would every
# training the tests start: the Ctrl-C tests expect a terminal's job, as Python sets one up.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    torch.manual_seed(0)
    yield
    torch.set_num_threads(1)  # a test that tuned threads (torch_threads=auto) leaves one
