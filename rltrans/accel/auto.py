"""``compile=auto``: compile only where it pays, with a hard bound on what trying may cost.

Compiling a training step costs a minute on a quiet 2-core machine and can cost many on a
busy one, before the first compiled update ends; whether the compiled step is then faster
depends on the model, the machine and its load. So the chooser never bets more than a
share of the run on it:

* The first ``measure`` updates run eager and are timed: t seconds each, U updates left.
* **Budget.** Trying may cost at most ``share`` (10 %) of the rest of the run eager,
  B = share x U x t. Compiling is tried only where B exceeds the expected compile time; the
  update that compiles runs under a deadline of B seconds of wall time. Past it the update
  is dropped (the trainer restores its state from before it, :class:`CompileOverBudget`)
  and the run goes on eager: the attempt cost at most B, a tenth of what was left.
* **Check.** The next ``measure`` compiled updates are timed; unless the fastest is at
  least 5 % faster than the fastest eager one, the run goes back to eager.
* **Memory.** Each outcome (compiled and faster; slower; over budget) is kept in
  ``rltrans-compile.json`` in Inductor's cache folder, keyed by the workload (model, PPO
  shapes, env, torch, CPU, thread count): a later run of the same workload stays eager at
  once where compiling did not pay, and compiles without the estimate where it did (then
  mostly from Inductor's caches), still under the budget. Delete the file to measure again;
  ``RLTRANS_COMPILE_MEMORY`` names another file.

Every decision is said once on stderr, with its figures.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rltrans.accel.compile import cache_dir

MEMORY_FILE = "rltrans-compile.json"
MEMORY_ENV = "RLTRANS_COMPILE_MEMORY"  # another file for the decisions (tests isolate theirs)
SHARE = 0.10  # the most of the rest of a run (eager) that trying to compile may cost
FASTER = 0.95  # compiled updates must take at most this share of the eager ones to stay


class CompileOverBudget(BaseException):
    """The compiling update ran past its budget: the trainer drops it and goes on eager (a
    BaseException, so no ``except Exception`` on the way, such as a compile fallback, takes
    it for a failure of its own)."""

    def __init__(self, budget_s: float) -> None:
        super().__init__(f"compiling took over its budget of {budget_s:.0f} s")
        self.budget_s = budget_s


@contextlib.contextmanager
def deadline(seconds: float | None, exc: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``exc()`` in the main thread once ``seconds`` of wall time pass inside the block
    (also while it waits on a compiler subprocess); None, or outside the main thread: no
    deadline. A timer thread sends SIGUSR1 to the main thread; the handler raises only while
    the block runs, and the previous handler comes back after the timer has stopped."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    inside = [True]

    def expired(signum: int, frame: Any) -> None:
        if inside[0]:
            inside[0] = False
            raise exc()

    main = threading.main_thread().ident
    previous = signal.signal(signal.SIGUSR1, expired)
    timer = threading.Timer(max(0.0, seconds), signal.pthread_kill, (main, signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        inside[0] = False
        timer.cancel()
        timer.join()  # a signal it sent meets `expired` (now a no-op), not SIGUSR1's default
        signal.signal(signal.SIGUSR1, previous)


def workload_key(*parts: Any) -> str:
    """A digest of what a compiled program depends on (config sections, device, thread
    count) with torch's version and the CPU: the key of a remembered decision."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    text = json.dumps([torch.__version__, cpu, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class Memory:
    """Decisions of earlier runs by workload key, in one JSON file (best effort: a file that
    cannot be read or written remembers nothing and never stops a run)."""

    def __init__(self, path: Path | None = None) -> None:
        given = os.environ.get(MEMORY_ENV)
        self.path = path or (Path(given) if given else cache_dir() / MEMORY_FILE)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The decision kept for ``key`` (``{"choice": ..., "why": ...}``), else None."""
        found = self._read().get(key)
        ok = isinstance(found, dict) and found.get("choice") in ("compiled", "eager")
        return found if ok else None

    def put(self, key: str, choice: str, why: str) -> None:
        """Keep ``choice`` for ``key`` (atomically: a crash leaves the old file)."""
        data = self._read()
        data[key] = {"choice": choice, "why": why}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)


class AutoCompile:
    """``compile=auto``'s chooser over ``updates_left`` updates (see the module docstring).

    ``after_update`` gets the seconds each update's compilable work took (learner steps and
    acting steps); ``budget_s`` is the deadline of the update that compiles (None when no
    compile is due); ``over_budget`` accounts a dropped one. ``enable`` / ``disable`` switch
    the programs; ``report`` gets each decision's line; ``memory`` and ``key`` remember them.
    """

    def __init__(
        self,
        updates_left: int,
        *,
        enable: Callable[[], Any],
        disable: Callable[[], Any],
        report: Callable[[str], Any] | None = None,
        measure: int = 2,
        compile_seconds: float = 60.0,
        share: float = SHARE,
        memory: Memory | None = None,
        key: str | None = None,
    ) -> None:
        self.updates_left, self.enable, self.disable = updates_left, enable, disable
        self.report = report or (lambda line: None)
        self.measure, self.compile_seconds, self.share = measure, compile_seconds, share
        self.memory, self.key = memory, key
        self.eager: list[float] = []
        self.compiled: list[float] = []
        self.compiling = True  # the first compiled update compiles: not timed
        self.checked = False  # the compiled choice was compared with eager (or restored)
        self.choice: str | None = None  # None while measuring; then "compiled" or "eager"
        self.budget_s: float | None = None  # the compiling update's deadline, once due
        self.remembered = memory.get(key) if memory is not None and key else None
        if self.remembered and self.remembered["choice"] == "eager":
            self.choice, self.checked = "eager", True
            self.report(
                f"compile=auto: staying eager, as an earlier run of this workload found "
                f"({self.remembered.get('why', '')}; kept in {memory.path}; compile=true "
                "compiles regardless)"
            )

    def restore(self, choice: str | None) -> None:
        """Apply a checkpoint's choice (``compiled`` / ``eager``) without measuring again."""
        if choice in ("compiled", "eager"):
            self.choice = choice
            self.checked = True  # it was checked when it was chosen
            self.budget_s = None
            if choice == "compiled":
                self.enable()

    def compile_due(self) -> bool:
        """Whether the next update compiles (and runs under :attr:`budget_s`)."""
        return self.choice == "compiled" and self.compiling and not self.checked

    def over_budget(self, err: CompileOverBudget) -> None:
        """The compiling update was dropped past its budget: eager from now on, remembered."""
        self.choice, self.checked, self.budget_s = "eager", True, None
        self.disable()
        why = f"compiling took over {err.budget_s:.0f} s, {self.share:.0%} of the run"
        self._remember("eager", why)
        self.report(f"compile=auto: back to eager ({why}; the update was dropped and rerun)")

    def _remember(self, choice: str, why: str) -> None:
        if self.memory is not None and self.key:
            self.memory.put(self.key, choice, why)

    def after_update(self, seconds: float) -> None:
        """Account one finished update whose compilable work took ``seconds``."""
        self.updates_left -= 1
        if self.choice == "eager" or self.checked:
            return
        if self.choice is None:
            self.eager.append(seconds)
            if len(self.eager) < self.measure and self.updates_left > 0:
                return
            self._decide(min(self.eager))
            return
        if self.compiling:  # choice == "compiled"; this update paid the compilation
            self.compiling, self.budget_s = False, None
            return
        self.compiled.append(seconds)
        if len(self.compiled) == self.measure:  # as many compiled updates as eager ones
            self._check(min(self.eager), min(self.compiled))

    def _decide(self, t: float) -> None:
        budget = self.share * self.updates_left * t
        known = self.remembered is not None  # compiled and faster in an earlier run
        tries = self.updates_left > self.measure and (known or budget > self.compile_seconds)
        figures = (
            f"{self.updates_left} updates left x {t:.2f} s eager: trying may cost "
            f"{self.share:.0%} of that, {budget:.0f} s"
        )
        if tries:
            self.choice, self.budget_s = "compiled", budget
            expected = "compiled faster before" if known else f"~{self.compile_seconds:.0f} s"
            self.report(f"compile=auto: compiling ({figures}; expected {expected})")
            self.enable()
        else:
            self.choice = "eager"
            self.report(
                f"compile=auto: staying eager ({figures}, under the "
                f"~{self.compile_seconds:.0f} s compiling takes)"
            )

    def _check(self, eager: float, fast: float) -> None:
        self.checked = True
        if fast > FASTER * eager:
            self.choice = "eager"
            self.disable()
            why = f"compiled updates took {fast:.2f} s against {eager:.2f} s eager"
            self._remember("eager", why)
            self.report(f"compile=auto: back to eager ({why})")
        else:
            self._remember("compiled", f"compiled updates ran {eager / fast:.2f}x faster")
            self.report(f"compile=auto: compiled updates run {eager / fast:.2f}x faster")


__all__ = ["AutoCompile", "CompileOverBudget", "Memory", "deadline", "workload_key"]
