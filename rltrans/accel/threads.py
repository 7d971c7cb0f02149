"""torch intra-op threads: a fixed count, or ``auto``, measured on the work at hand.

Small RL models act and learn fastest on one thread (a second thread costs more in
synchronisation than it saves, and on a shared machine a busy second core slows a
multi-threaded step several times), while an image learner's convolutions over thousands of
frames gain from every core. ``auto`` does not guess which case a run is: a
:class:`ThreadTuner` times the run's own calls (learner steps, or acting steps) at each
candidate :class:`Plan`, interleaved so that machine noise hits all of them alike, and keeps
the one on the fewest cores within ``min_gain`` of the fastest.

A plan is either ``n`` intra-op threads for the whole call, or (for calls that can split
their work, such as a learner's minibatch) ``n`` streams: the work in ``n`` parts run side by
side on their own Python threads with one torch thread each (torch ops release the GIL).
Convolutions and small matmuls scale poorly across intra-op threads, but two one-thread
streams keep each core at its one-thread efficiency: a MiniGrid PPO minibatch (Nature CNN +
GTrXL, 512 frames) took 712 ms on one thread, 460 ms on two and 393 ms as two streams.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "AUTO", "Plan", "ThreadTuner", "available_cores", "candidates", "set_threads", "tuned",
]  # fmt: skip

AUTO = "auto"


@dataclass(frozen=True)
class Plan:
    """How one call uses the cores: ``streams`` parts of its work side by side, each on its
    own Python thread with ``threads`` torch intra-op threads (1 stream: the call as one)."""

    threads: int
    streams: int = 1

    @property
    def cores(self) -> int:
        """Cores the plan keeps busy."""
        return self.threads * self.streams

    def __str__(self) -> str:
        if self.streams == 1:
            return f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{self.streams} streams x {self.threads} thread{'s' if self.threads > 1 else ''}"


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
    """Chooses how one kind of call uses the cores by timing the calls themselves.

    Use ``with tuner:`` around each call (a learner step, an acting step). Until it decides,
    the tuner sets a different candidate :class:`Plan` for each call, round-robin (torch's
    thread count, and :attr:`plan` for a call that can run in streams), and records the wall
    time; the first ``warmup`` calls of each candidate are not counted (compilation,
    allocator warm-up). After ``trials`` counted calls per candidate it keeps the plan on the
    fewest cores whose median time is within ``min_gain`` of the fastest median (the faster
    of two such plans on as many cores), reports it once through ``report`` (each plan's
    speed and median ms per call) and sets it on every later entry. Where a plan's median
    differs from the fewest-core plan's by more than ``min_gain`` but by less than the
    spread of either's calls (a busy machine), the timings cannot decide: it keeps the
    fewest cores and says so. A plan whose two or more counted calls are all ``hopeless``
    times slower than another plan's median cannot be chosen: it is not timed again (on a busy
    machine an oversubscribed plan can run 30x slower, and a learner step over long segments
    takes seconds). ``counts`` are the thread counts tried; ``streams`` adds, for each
    count n > 1, n one-thread streams (only for callers that read :attr:`plan`). With one
    candidate (one core, or a fixed count) it never times anything.
    """

    def __init__(
        self,
        name: str,
        counts: tuple[int, ...] | None = None,
        *,
        streams: bool = False,
        trials: int = 5,
        warmup: int = 1,
        min_gain: float = 1.1,
        hopeless: float = 3.0,
        report: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = name
        self.counts = tuple(counts) if counts is not None else candidates()
        self.plans = tuple(Plan(n) for n in self.counts)
        if streams:
            self.plans += tuple(Plan(1, n) for n in self.counts if n > 1)
        self.trials, self.warmup, self.min_gain, self.report = trials, warmup, min_gain, report
        self.hopeless = hopeless
        self.times: dict[Plan, list[float]] = {p: [] for p in self.plans}
        self.dropped: list[Plan] = []  # plans too slow to be chosen: no longer timed
        self.seen: dict[Plan, int] = dict.fromkeys(self.plans, 0)
        self.chosen_plan: Plan | None = self.plans[0] if len(self.plans) == 1 else None
        self._turn = 0
        self._current: Plan | None = None
        self._start = 0.0

    @property
    def chosen(self) -> int | None:
        """Torch threads (per stream) of the chosen plan; None while still measuring."""
        return None if self.chosen_plan is None else self.chosen_plan.threads

    @property
    def plan(self) -> Plan:
        """The plan of the call in progress (the chosen one once decided)."""
        if self._current is not None:
            return self._current
        return self.chosen_plan or self.plans[0]

    def __enter__(self) -> ThreadTuner:
        plan = self.chosen_plan
        if plan is None:
            timed = [p for p in self.plans if p not in self.dropped]
            plan = timed[self._turn % len(timed)]
        if torch.get_num_threads() != plan.threads:
            torch.set_num_threads(plan.threads)
        self._current = plan
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        plan, self._current = self._current, None
        if self.chosen_plan is not None or exc[0] is not None or plan is None:
            return
        elapsed = time.perf_counter() - self._start
        self.seen[plan] += 1
        if self.seen[plan] > self.warmup:
            self.times[plan].append(elapsed)
            self._drop_hopeless()
        self._turn += 1
        if all(len(self.times[p]) >= self.trials for p in self.plans if p not in self.dropped):
            self._decide()

    def _drop_hopeless(self) -> None:
        """Stop timing every plan whose fastest of two or more calls is ``hopeless`` x slower
        than another timed plan's median (the fewest-core plan is always kept)."""
        medians = {p: statistics.median(t) for p, t in self.times.items() if t}
        for plan in self.plans[1:]:
            if len(self.times[plan]) < 2 or plan in self.dropped:  # one call can be a hiccup
                continue
            others = [m for p, m in medians.items() if p != plan and p not in self.dropped]
            if others and min(self.times[plan]) > self.hopeless * min(others):
                self.dropped.append(plan)

    def _decide(self) -> None:
        medians = {p: statistics.median(t) for p, t in self.times.items()}
        fastest = min(medians.values())
        good = [p for p, m in medians.items() if m <= fastest * self.min_gain]
        noisy = self._noisy(medians)
        # Timings that cannot tell the plans apart keep the fewest cores (the safe default).
        self.chosen_plan = (
            self.plans[0] if noisy else min(good, key=lambda p: (p.cores, medians[p]))
        )
        if self.report is None:
            return
        timings = "median " + ", ".join(f"{p} {_ms(m)} ms" for p, m in medians.items())
        if self.dropped:
            slow = ", ".join(str(p) for p in self.dropped)
            timings += f"; {slow} over {self.hopeless:g}x slower, dropped"
        if noisy:
            spread = ", ".join(
                f"{p} {_ms(min(self.times[p]))}-{_ms(max(self.times[p]))} ms" for p in noisy
            )
            self.report(  # the fewest: the times cannot tell the plans apart
                f"torch_threads=auto: {self.name} uses {self.chosen_plan} (busy machine, "
                f"times overlap: {spread})"
            )
        else:
            self.report(f"torch_threads=auto: {self.name} uses {self.chosen_plan} ({timings})")

    def _noisy(self, medians: dict[Plan, float]) -> list[Plan]:
        """The plans (the fewest-core plan first) whose median differs from the fewest-core
        plan's by more than ``min_gain`` but by less than the spread (slowest - fastest call)
        of either: a difference that would matter and that the timings cannot resolve."""
        base = self.plans[0]

        def spread(plan: Plan) -> float:
            return max(self.times[plan]) - min(self.times[plan])

        unresolved = []
        for plan in self.plans[1:]:
            slow, fast = sorted((medians[plan], medians[base]), reverse=True)
            matters = slow > fast * self.min_gain
            if matters and slow - fast <= max(spread(plan), spread(base)):
                unresolved.append(plan)
        return [base, *unresolved] if unresolved else []

    def state_dict(self) -> dict[str, Any]:
        """The choice, for checkpoints (a resumed run keeps it instead of measuring again)."""
        plan = self.chosen_plan
        return {"chosen": self.chosen, "streams": None if plan is None else plan.streams}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s choice (nothing to restore while still measuring); a
        saved plan in streams is kept only where this tuner offers streams."""
        if state.get("chosen") is not None:
            plan = Plan(int(state["chosen"]), int(state.get("streams") or 1))
            self.chosen_plan = plan if plan in self.plans else Plan(plan.threads)


def _ms(seconds: float) -> str:
    """A call's time in milliseconds: three significant digits, whole ms from 100 ms up."""
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def tuned(tuner: ThreadTuner | None) -> contextlib.AbstractContextManager:
    """``with tuned(tuner):`` times the block under ``tuner``; with None it does nothing."""
    return contextlib.nullcontext() if tuner is None else tuner
