"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (what cluster schedulers send).

Inside :class:`StopSignals` the first of these signals records itself. An update the trainer
copied its state before (see :mod:`rltrans.trainers.skeleton`) runs inside
:meth:`StopSignals.abortable`: there the first signal also raises :class:`StopNow`, the
update is dropped and the copy, the state after the last whole update, is written as the
checkpoint within seconds, wherever the update was. After any other update the trainer asks
:meth:`StopSignals.poll`. Either way the summary says ``status: interrupted`` and
``signal``, and the command exits with 128 + the signal's number (130, 143).

A second signal ends the process at once: from the command line (:data:`EXIT_AT_ONCE`) with
one line on stderr, 128 + its number and no traceback, the checkpoints on disk as they were
(every write is atomic); from Python it gets the handling in place before (KeyboardInterrupt
for SIGINT, termination for SIGTERM). Signals within :data:`REPEAT_S` of the first count as
that one: under torchrun a terminal's Ctrl-C reaches each learner process twice.

:meth:`StopSignals.request` stops the same way for a caller (a callback of
:func:`rltrans.learn`), with ``status: stopped_early``. Under torchrun no update is dropped
(every learner process runs the same collectives): every process polls at every update in one
collective, so all stop after the same update (torchrun kills them 30 s after forwarding a
signal: an update and a checkpoint must fit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

from rltrans import distributed

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_S = 1.0  # a signal this soon after the first is the same request, delivered twice
# Whether a second signal ends the process at once (os._exit) with one line: set by the
# command-line tools (rltrans.cli); a Python caller (rltrans.learn) keeps its own handling.
EXIT_AT_ONCE = False


class StopNow(BaseException):
    """The first stop signal, raised inside :meth:`StopSignals.abortable` (a BaseException,
    so no ``except Exception`` in the update swallows it)."""


class StopSignals:
    """Records the first SIGINT / SIGTERM while active (handlers in the main thread only,
    the previous ones restored on exit); :meth:`poll` says whether to stop."""

    def __init__(
        self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS, repeat_s: float = REPEAT_S
    ) -> None:
        self.signals, self.repeat_s = signals, repeat_s
        self.received: signal.Signals | None = None  # the first signal this process got
        self._received_at = 0.0
        self.stop_signal: signal.Signals | None = None  # the one the run stops for, once polled
        self.requested: str | None = None  # why a caller asked this process to stop (request)
        self.reason: str | None = None  # the request the run stops for, once polled
        self._previous: dict[signal.Signals, Any] = {}
        self._abortable = 0  # depth of abortable() regions now running
        # What a second signal's line adds: where the run's last checkpoint is (the trainer's).
        self.where: Callable[[], str] = str

    def install(self) -> StopSignals:
        """Take over the signals' handling (from the main thread; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set handlers: signals keep their handling
        for sig in self.signals:
            # A signal ignored when the process started (``cmd &`` in a script ignores
            # SIGINT) stays ignored, as Python itself leaves it.
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Give the signals their previous handling back (idempotent)."""
        for sig, handler in self._previous.items():
            # None: a handler not set from Python; the default is the closest there is.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signal.Signals(signum), now
            if self._abortable and not distributed.active():
                raise StopNow(signum)  # drop the update under way: its copy is saved
            return
        if now - self._received_at < self.repeat_s:
            return  # the first one again (the terminal's and torchrun's copy)
        # The second signal: at once.
        if EXIT_AT_ONCE:
            name = signal.Signals(signum).name
            with contextlib.suppress(Exception):  # a closed or full stderr: exit all the same
                print(f"rltrans: second {name}: exiting now{self.where()}", file=sys.stderr)
                sys.stderr.flush()
            os._exit(128 + signum)
        previous = self._previous.get(signal.Signals(signum))
        self.restore()
        if callable(previous):
            previous(signum, frame)  # e.g. Python's SIGINT handler: KeyboardInterrupt
        else:
            signal.raise_signal(signum)  # SIG_DFL: the signal ends the process

    @contextlib.contextmanager
    def abortable(self, enabled: bool = True) -> Iterator[None]:
        """A region (an update whose state before it was copied) that the first signal
        ends at once with :class:`StopNow`; one that came before it ends it on entry."""
        if not enabled or distributed.active():
            yield
            return
        if self.received is not None:
            raise StopNow(int(self.received))
        self._abortable += 1
        try:
            yield
        finally:
            self._abortable -= 1

    def dropped(self) -> None:
        """Account a :class:`StopNow`: the run stops for the signal that raised it."""
        self.stop_signal = self.received

    def request(self, reason: str) -> None:
        """Stop after the current update as a signal would, for ``reason`` (a callback's
        answer); the summary's status is then ``stopped_early``."""
        if self.requested is None:
            self.requested = reason

    def poll(self) -> bool:
        """True when this run is to stop after the current update: a signal or a
        :meth:`request` reached this process or, under torchrun, any learner process (a
        collective: every rank calls it once per update)."""
        if self.stop_signal is not None or self.reason is not None:
            return True
        if distributed.all_true(self.received is None and self.requested is None):
            return False
        # Stopping: for which signal or request (the lowest rank's; one more collective).
        mine = self.received if self.received is not None else self.requested
        first = next(r for r in distributed.gather_objects(mine) if r is not None)
        if isinstance(first, signal.Signals):
            self.stop_signal = first
        else:
            self.reason = str(first)
        return True

    @property
    def name(self) -> str | None:
        """``SIGINT`` / ``SIGTERM`` once :meth:`poll` said stop for one, else None."""
        return None if self.stop_signal is None else self.stop_signal.name

    @property
    def status(self) -> str:
        """The summary's status once :meth:`poll` said stop: ``interrupted`` for a signal,
        ``stopped_early`` for a request."""
        return "interrupted" if self.stop_signal is not None else "stopped_early"

    def summary(self, status: str) -> dict[str, str]:
        """``{"signal": "SIGTERM"}`` for a summary line whose ``status`` is interrupted,
        ``{"stop_reason": ...}`` for one stopped early by a request."""
        if status == "interrupted" and self.name:
            return {"signal": self.name}
        return {"stop_reason": self.reason} if status == "stopped_early" and self.reason else {}

    def report(
        self, step: int, checkpoint: str | None, run_dir: Any, *, dropped: bool = False
    ) -> None:
        """One stderr line: which signal or request stopped the run, at which step (after
        the update under way, or before it where ``dropped``), its checkpoint."""
        when = "the update under way dropped" if dropped else "after the current update"
        answered = ""
        if self.received is not None and self._received_at:
            answered = f", {time.monotonic() - self._received_at:.1f} s after the signal"
        print(
            f"rltrans: {self.name or self.reason}: training stopped at step {step} ({when}"
            f"{answered}); checkpoint {checkpoint} (continue with resume=true run_dir={run_dir})",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


__all__ = ["EXIT_AT_ONCE", "STOP_SIGNALS", "StopNow", "StopSignals"]
