"""Shared test setup: one torch thread (CI has 2 shared cores), deterministic seeds, and the
tier of each test, read from its folder: ``tests/cli/`` (commands and trainings run end to
end) is marked ``cli``, ``tests/repo/`` (checks of the repository's files) ``repo``; every
other folder mirrors a package and is the default tier (pyproject.toml's addopts), but for a
test there marked ``cli`` by hand (it trains, starts actor processes or compiles: seconds
each). A test marked ``slow`` or ``docs`` stays in that tier alone: each test is in one."""

import os
import signal
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

# A script's background job (``pytest &``) starts with SIGINT ignored, and so would every
# training the tests start: the Ctrl-C tests expect a terminal's job, as Python sets one up.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).resolve().parent
TIER_FOLDERS = ("cli", "repo")  # each folder's name is its marker


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test in a tier's folder with that tier, unless it is slow or a docs example."""
    for item in items:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
        own_tier = item.get_closest_marker("slow") or item.get_closest_marker("docs")
        if parts[0] in TIER_FOLDERS and not own_tier:
            item.add_marker(parts[0])


@pytest.fixture(autouse=True)
def _compile_memory(tmp_path_factory, monkeypatch) -> None:
    """compile=auto's remembered decisions go to a file of each test's own (also for the
    trainings it starts in subprocesses): no test sees another's."""
    folder = tmp_path_factory.mktemp("compile-memory")
    monkeypatch.setenv("RLTRANS_COMPILE_MEMORY", str(folder / "rltrans-compile.json"))


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    torch.manual_seed(0)
    yield
    torch.set_num_threads(1)  # a test that tuned threads (torch_threads=auto) leaves one
