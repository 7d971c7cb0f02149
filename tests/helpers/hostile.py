"""What the fuzzers of hostile inputs share: their hypothesis settings, a time limit that
turns a hang into a failure, the peak resident set, and a listing of a folder's files."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

EXAMPLE_SECONDS = 90  # far above any example's real time (about a second)
# Growth of the test process's peak resident set over one fuzzer: with pytest and torch at
# ~0.5 GB, a command on hostile input stays below 2 GB in all.
PEAK_GROWTH_MB = 1536
FUZZ = settings(
    max_examples=25,
    deadline=None,
    # No explain phase (its line tracer makes a deep parse minutes long, which would read as
    # a hang) and no shrinking (a failure is reported as found: shrinking one that hangs
    # would run the time limit once per attempt).
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@contextlib.contextmanager
def time_limit(seconds: int = EXAMPLE_SECONDS) -> Iterator[None]:
    """Fail the test (instead of hanging it) when the block runs longer than ``seconds``."""

    def expired(*_):
        # pytest.fail raises a BaseException: no ``except Exception`` in the code under test
        # can swallow it and report the hang as an ordinary error.
        pytest.fail(f"no answer within {seconds} s (a blocking read? an unbounded loop?)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def peak_mb() -> float:
    """The peak resident set of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def snapshot(root: Path) -> set[str]:
    """Every path under ``root``, relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@contextlib.contextmanager
def address_space_limit(extra_mb: int = 1024) -> Iterator[None]:
    """Cap this process's address space at its present size plus ``extra_mb`` for the block:
    an allocation sized by a file that lies fails there (MemoryError) instead of taking the
    machine's memory. Linux only; elsewhere the block runs without a cap."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        yield
        return
    size = int(statm.read_text().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + extra_mb * 2**20
    resource.setrlimit(
        resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
    )
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
