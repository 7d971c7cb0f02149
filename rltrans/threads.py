"""torch intra-op threads: a fixed count, or ``auto``, measured on the work at hand.

Small RL models act and learn fastest on one thread (a second thread costs more in
synchronisation than it saves, and on a shared machine a busy second core slows a
multi-threaded step several times), while an image learner's convolutions over thousands of
frames gain from every core. ``auto`` does not guess which case a run is: a
:class:`ThreadTuner` times the run's own calls (learner steps, or acting steps) at each
candidate count, interleaved so that machine noise hits all of them alike, and keeps the
fewest threads within ``min_gain`` of the fastest.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["AUTO", "ThreadTuner", "available_cores", "candidates", "set_threads", "tuned"]

AUTO = "auto"


def available_cores() -> int:
    """CPU cores ``auto`` may use: this process's affinity mask (else the machine's count),
    capped by ``OMP_NUM_THREADS`` when that is set (a user's or a scheduler's limit)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(limit))) if limit.isdigit() and int(limit) > 0 else cores


def set_threads(threads: int | str | None) -> None:
    """Set torch's intra-op threads: a count, 0 / None = torch's default, ``auto`` = one
    (until a :class:`ThreadTuner` has measured more to be faster)."""
    if threads == AUTO:
        torch.set_num_threads(1)
    elif threads:
        torch.set_num_threads(int(threads))


def candidates(cores: int | None = None) -> tuple[int, ...]:
    """Thread counts ``auto`` tries: 1, then powers of two, then every available core."""
    cores = available_cores() if cores is None else max(1, cores)
    out, n = [1], 2
    while n < cores:
        out.append(n)
        n *= 2
    if cores > 1:
        out.append(cores)
    return tuple(out)


class ThreadTuner:
    """Chooses the thread count of one kind of call by timing the calls themselves.

    Use ``with tuner:`` around each call (a learner step, an acting step). Until it decides,
    the tuner sets a different candidate count for each call, round-robin, and records the
    wall time; the first ``warmup`` calls of each candidate are not counted (compilation,
    allocator warm-up). After ``trials`` counted calls per candidate it keeps the fewest
    threads whose median time is within ``min_gain`` of the fastest median, reports it once
    through ``report`` and sets that count on every later entry. With one candidate (one
    core, or a fixed count) it never times anything.
    """

    def __init__(
        self,
        name: str,
        counts: tuple[int, ...] | None = None,
        *,
        trials: int = 5,
        warmup: int = 1,
        min_gain: float = 1.1,
        report: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = name
        self.counts = tuple(counts) if counts is not None else candidates()
        self.trials, self.warmup, self.min_gain, self.report = trials, warmup, min_gain, report
        self.times: dict[int, list[float]] = {n: [] for n in self.counts}
        self.seen: dict[int, int] = dict.fromkeys(self.counts, 0)
        self.chosen: int | None = self.counts[0] if len(self.counts) == 1 else None
        self._turn = 0
        self._current: int | None = None
        self._start = 0.0

    def __enter__(self) -> ThreadTuner:
        n = self.chosen if self.chosen is not None else self.counts[self._turn % len(self.counts)]
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        self._current = n
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.chosen is not None or exc[0] is not None:
            return
        elapsed = time.perf_counter() - self._start
        n = self._current
        self.seen[n] += 1
        if self.seen[n] > self.warmup:
            self.times[n].append(elapsed)
        self._turn += 1
        if all(len(t) >= self.trials for t in self.times.values()):
            self._decide()

    def _decide(self) -> None:
        medians = {n: statistics.median(t) for n, t in self.times.items()}
        fastest = min(medians.values())
        self.chosen = min(n for n, m in medians.items() if m <= fastest * self.min_gain)
        if self.report is not None:
            one = medians[self.counts[0]]
            speeds = ", ".join(f"{n}: {one / m:.2f}x" for n, m in medians.items())
            self.report(
                f"torch_threads=auto: {self.name} uses {self.chosen} thread"
                f"{'s' if self.chosen > 1 else ''} (speed vs 1 thread, median of "
                f"{self.trials} calls each: {speeds})"
            )

    def state_dict(self) -> dict[str, Any]:
        """The choice, for checkpoints (a resumed run keeps it instead of measuring again)."""
        return {"chosen": self.chosen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s choice (nothing to restore while still measuring)."""
        if state.get("chosen") is not None:
            self.chosen = int(state["chosen"])


def tuned(tuner: ThreadTuner | None) -> contextlib.AbstractContextManager:
    """``with tuned(tuner):`` times the block under ``tuner``; with None it does nothing."""
    return contextlib.nullcontext() if tuner is None else tuner
