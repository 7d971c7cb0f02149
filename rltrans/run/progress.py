"""The progress line of long work (training, evaluation, collection, dataset loading): a
tqdm bar on a terminal, and a plain line every ``every_s`` seconds elsewhere (a log file, a
cluster job's output), so a run that is not watched still says how far it is.

Example:
    >>> with ProgressBar(total_steps, "train") as bar:
    ...     bar.update(num_envs, ret=tracker.mean_return)
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any, TextIO

import numpy as np
import torch
from tqdm import tqdm


def _format_value(value: Any) -> str:
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """tqdm bar on a terminal; elsewhere (CI, cluster logs) a compact line every `every_s` seconds.

    The bar is off when stderr is not a TTY or `RLTRANS_NO_PROGRESS=1`; then a line
    such as `train: 40.0k/1.0M step (4%) | 1.2k SPS | 0:00:33 elapsed | eta 0:13:20
    | ret=12.5` goes to stderr after the first update, every `every_s` seconds after that
    (env `RLTRANS_PROGRESS_EVERY_S` overrides the default) and once on close. The rate is
    named by what it counts: `SPS` for env steps, `episodes/s` for evaluation, `grad steps/s`
    offline. The ETA divides what is left by the rate since the first update, so the time
    before it (building, the first update's warm-up) does not inflate early estimates.

    Example:
        >>> with ProgressBar(total_steps, "train") as bar:
        ...     bar.update(num_envs, ret=tracker.mean_return)
    """

    def __init__(
        self,
        total: int | None,
        desc: str = "",
        unit: str = "step",
        *,
        every_s: float | None = None,
        stream: TextIO | None = None,
        initial: int = 0,
        quiet_if_quick: bool = False,
    ) -> None:
        """``initial``: units done before this process (a resumed run); they count towards
        the position but not towards the rate or the ETA. ``quiet_if_quick``: off a
        terminal, no final line when the work ended before the first periodic one."""
        self.quiet_if_quick, self._lines = quiet_if_quick, 0
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self.initial = initial
        self._stream = stream if stream is not None else sys.stderr
        if every_s is None:
            every_s = float(os.environ.get("RLTRANS_PROGRESS_EVERY_S", "30"))
        self.every_s = every_s
        no_progress = os.environ.get("RLTRANS_NO_PROGRESS", "") not in ("", "0")
        isatty = getattr(self._stream, "isatty", None)
        # tqdm writes to stderr, so stdout redirection (e.g. `> summary.json`) keeps the bar.
        self.interactive = not no_progress and callable(isatty) and bool(isatty())
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=True,
            dynamic_ncols=True,
            file=self._stream,
            disable=not self.interactive,
            initial=initial,
        )
        self._postfix: dict[str, str] = {}
        self._start = self._last_time = time.monotonic()
        self._last_n = initial
        # Where the first update ended: the ETA's rate is measured from there, so the time
        # before it (building envs, the first update's warm-up or compilation) does not
        # inflate every early estimate.
        self._first: tuple[float, int] | None = None
        self._closed = False

    @property
    def sps(self) -> float:
        """Average units per second done by this process since the bar was created."""
        return (self.n - self.initial) / max(time.monotonic() - self._start, 1e-9)

    @property
    def rate_label(self) -> str:
        """What the rate counts: ``SPS`` for env steps (RL's name), else ``<unit>s/s``."""
        return "SPS" if self.unit == "step" else f"{self.unit}s/s"

    def eta(self) -> float | None:
        """Seconds left at the rate since the first update (the average since the start
        until a second update), None without a total or any progress."""
        if not self.total or self.n <= self.initial:
            return None
        rate = self.sps
        if self._first is not None and self.n > self._first[1]:
            t, n = self._first
            rate = (self.n - n) / max(time.monotonic() - t, 1e-9)
        return max(self.total - self.n, 0) / max(rate, 1e-9)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by `n` units and show `postfix` values (e.g. `ret=tracker.mean_return`)."""
        self.n += n
        if self._first is None:
            self._first = (time.monotonic(), self.n)
        if postfix:
            self._postfix.update({k: _format_value(v) for k, v in postfix.items()})
        if self.interactive:
            if postfix:
                self._bar.set_postfix(self._postfix, refresh=False)
            self._bar.update(n)
        elif time.monotonic() - self._last_time >= self.every_s or self._first_line_due():
            self._print_line()

    def _first_line_due(self) -> bool:
        """Off a terminal, the first update prints a line at once (with the rate and the ETA
        it already knows), unless the bar stays quiet for quick work."""
        return self._lines == 0 and not self.quiet_if_quick

    def _print_line(self) -> None:
        now = time.monotonic()
        recent = (self.n - self._last_n) / max(now - self._last_time, 1e-9)
        self._last_time, self._last_n = now, self.n
        fmt = tqdm.format_sizeof
        parts = [f"{self.desc}: " if self.desc else ""]
        if self.total:
            parts[0] += f"{fmt(self.n)}/{fmt(self.total)} {self.unit} "
            parts[0] += f"({100 * self.n / self.total:.0f}%)"
        else:
            parts[0] += f"{fmt(self.n)} {self.unit}"
        parts.append(f"{fmt(recent)} {self.rate_label}")
        parts.append(f"{_format_duration(now - self._start)} elapsed")
        eta = self.eta()
        if eta is not None:
            parts.append(f"eta {_format_duration(eta)}")
        parts.extend(f"{k}={v}" for k, v in self._postfix.items())
        print(" | ".join(parts), file=self._stream, flush=True)
        self._lines += 1

    def close(self) -> None:
        """Finish the bar (or print a final progress line); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.interactive:
            self._bar.close()
        elif self._lines or not self.quiet_if_quick:
            self._print_line()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["ProgressBar"]
