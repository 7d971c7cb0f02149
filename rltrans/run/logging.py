"""Run logging: TensorBoard scalars under stable names, episode statistics, the summary line
(the progress line: :mod:`rltrans.run.progress`).

Metric names follow CleanRL's and are written verbatim:
`charts/episodic_return`, `losses/policy`, `perf/env_ms`, ...

Example:
    >>> with MetricLogger(run_dir) as logger, ProgressBar(total_steps, "train") as bar:
    ...     finished = tracker.update(info)
    ...     logger.log(step, {**tracker.metrics(), **prefixed(LOSSES, loss_metrics)})
    ...     bar.update(num_envs, ret=tracker.mean_return)
    >>> print_summary({"global_step": step, **logger.summary()})
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from rltrans import fsutil
from rltrans.fsutil import UnsafePathError

# Standard prefixes and names (as CleanRL logs them).
CHARTS = "charts/"
LOSSES = "losses/"
PERF = "perf/"
EPISODIC_RETURN = "charts/episodic_return"
EPISODIC_LENGTH = "charts/episodic_length"
SUCCESS_RATE = "charts/success_rate"
SPS = "charts/SPS"
LEARNING_RATE = "charts/learning_rate"

Scalar = float | int | bool | np.generic | np.ndarray | torch.Tensor


def prefixed(prefix: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Prefix every key: `prefixed(LOSSES, {"policy": x})` -> `{"losses/policy": x}`."""
    head = prefix if prefix.endswith("/") else prefix + "/"
    return {head + name: value for name, value in metrics.items()}


def _floats(metrics: Mapping[str, Scalar | None]) -> dict[str, float]:
    """Metric values as Python floats with one host sync per device for all tensor values."""
    out: dict[str, float] = {}
    tensors: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or name.startswith("/"):
            raise ValueError(f"metric name must be a non-empty str like 'losses/policy': {name!r}")
        if value is None:
            continue  # e.g. a mean return before the first episode ends
        if isinstance(value, torch.Tensor | np.ndarray):
            size = value.numel() if isinstance(value, torch.Tensor) else value.size
            if size != 1:
                raise ValueError(
                    f"metric {name!r} has shape {tuple(value.shape)}; log a scalar "
                    "(e.g. .mean()) or use log_histogram"
                )
        if isinstance(value, torch.Tensor):
            tensors.setdefault(value.device, []).append((name, value))
        elif isinstance(value, np.ndarray | np.generic):
            out[name] = float(value.item())
        else:
            out[name] = float(value)
    for device, group in tensors.items():
        # Stacking first turns N .item() syncs into one device-to-host copy.
        dtype = torch.float32 if device.type == "mps" else torch.float64
        stacked = torch.stack([t.detach().reshape(()).to(dtype) for _, t in group])
        out.update(zip((name for name, _ in group), stacked.tolist(), strict=True))
    return {name: out[name] for name in metrics if name in out}


class MetricLogger:
    """TensorBoard scalars and histograms in `run_dir/tb`, plus the latest value of each metric.

    Example:
        >>> with MetricLogger("runs/x") as logger:
        ...     logger.log(step, {"losses/policy": loss.detach(), "perf/env_ms": 3.2})
        ...     final = logger.summary()  # {"losses/policy": ..., "perf/env_ms": 3.2}
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        use_tensorboard: bool = True,
        purge_step: int | None = None,
        dir_fd: int | None = None,
    ) -> None:
        """``purge_step``: a resumed run's checkpoint step; TensorBoard hides the events an
        interrupted process wrote after it, so no step appears twice with two values.
        ``dir_fd``: a descriptor of ``run_dir`` (a run's own) to reach ``tb/`` through.

        ``tb/`` may not be a link: it is opened without following one, the event file is
        written through that descriptor, and a ``tb/`` swapped for anything else while the
        run writes is refused (UnsafePathError) at the next flush or close."""
        self.run_dir = Path(run_dir)
        self._writer: Any = None
        self._fds: tuple[int, int] | None = None  # (run folder, tb/)
        if use_tensorboard:
            # Imported here: tensorboard takes about a second to import and is optional at runtime.
            from torch.utils.tensorboard import SummaryWriter

            with self._events():  # a full disk: a new folder needs a block too
                self._fds = _open_tb(self.run_dir, dir_fd)
            _quiet_writer_threads()
            try:
                log_dir = _through_fd(self._fds[1], self.tb_dir)
                self._writer = SummaryWriter(log_dir=log_dir, purge_step=purge_step)
                self._check_tb()
            except BaseException:
                self._close_fds()
                raise
        self._latest: dict[str, float] = {}
        self._last_step: dict[str, int] = {}
        # Called with (step, the floats logged) after each log(): rltrans.learn's callbacks.
        self.listeners: list[Callable[[int, dict[str, float]], None]] = []
        self._closed = False

    @property
    def tb_dir(self) -> Path:
        """Directory holding the TensorBoard event files."""
        return self.run_dir / "tb"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MetricLogger is closed; create a new one to keep logging")

    def log(self, step: int, metrics: Mapping[str, Scalar | None]) -> None:
        """Write scalars at `step`; 0-d tensors are fetched together, None values are skipped."""
        self._check_open()
        values = _floats(metrics)
        if self._writer is not None:
            with self._events():
                for name, value in values.items():
                    self._writer.add_scalar(name, value, global_step=step)
        self._latest.update(values)
        self._last_step.update(dict.fromkeys(values, step))
        for listener in self.listeners:
            listener(step, dict(values))

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        """Write a histogram of `values` (non-finite entries dropped; empty input skipped)."""
        self._check_open()
        flat = torch.as_tensor(
            np.asarray(values) if not isinstance(values, torch.Tensor) else values
        )
        flat = flat.detach().reshape(-1).to("cpu", torch.float64)
        flat = flat[torch.isfinite(flat)]  # TensorBoard's histogram rejects NaN/inf
        if self._writer is not None and flat.numel() > 0:
            with self._events():
                self._writer.add_histogram(name, flat.numpy(), global_step=step)

    def summary(self) -> dict[str, float]:
        """Latest value of every metric logged so far, in first-logged order."""
        return dict(self._latest)

    def last_step(self, name: str) -> int | None:
        """Step at which `name` was last logged, or None if never."""
        return self._last_step.get(name)

    @contextlib.contextmanager
    def _events(self) -> Iterator[None]:
        """TensorBoard's writes (its writer thread reports a failed one at the next call): a
        write the file system refuses (a full disk) becomes one StorageError naming tb/."""
        try:
            yield
        except Exception as err:
            cause = fsutil.storage_cause(err)
            if cause is None:
                raise
            raise fsutil.StorageError(
                cause.errno, f"cannot write TensorBoard events in {self.tb_dir}: "
                f"{os.strerror(cause.errno)}"
            ) from None  # fmt: skip

    def _check_tb(self) -> None:
        """UnsafePathError unless ``tb/`` is still the real folder this logger opened."""
        if self._fds is not None and not fsutil.same_dir(self._fds[1], "tb", dir_fd=self._fds[0]):
            raise UnsafePathError(
                errno.ELOOP,
                f"{self.tb_dir} was replaced (by a link?) while the run was writing it; "
                "rltrans never writes through links: its events stay in the folder it opened",
            )

    def _close_fds(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def flush(self) -> None:
        """Push pending events to disk (checking ``tb/`` is still the folder it was)."""
        if self._writer is not None and not self._closed:
            with self._events():
                self._writer.flush()
            self._check_tb()

    def close(self) -> None:
        """Flush and close the event file; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None:
                with self._events():
                    try:
                        self._writer.flush()
                    finally:  # its writer thread reports a failed flush again: one error
                        self._writer.close()
                self._check_tb()
        finally:
            self._close_fds()

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quiet_writer_threads() -> None:
    """Keep TensorBoard's writer thread from printing a traceback for a write the file system
    refused: the writer reports the same error to the next call, where it becomes one
    StorageError line (:meth:`MetricLogger._events`). Any other thread error prints as before."""
    previous = threading.excepthook
    if getattr(previous, "rltrans_quiet", False):
        return

    def hook(args: Any) -> None:
        from_writer = type(args.thread).__module__.startswith("tensorboard.")
        if from_writer and fsutil.storage_cause(args.exc_value) is not None:
            return
        previous(args)

    hook.rltrans_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _open_tb(run_dir: Path, dir_fd: int | None) -> tuple[int, int]:
    """Descriptors of the run folder and of its ``tb/`` (created), neither opened through a
    link at its own name."""
    if dir_fd is not None:
        parent = os.dup(dir_fd)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        parent = fsutil.open_dir(run_dir)
    try:
        return parent, fsutil.open_dir("tb", dir_fd=parent, create=True)
    except BaseException:
        os.close(parent)
        raise


def _through_fd(tb_fd: int, tb_dir: Path) -> str:
    """The log_dir to give TensorBoard: the folder ``tb_fd`` holds, named through
    ``/proc/self/fd`` (Linux), so that every path TensorBoard opens in it resolves through
    that descriptor: a link swapped in for ``tb/`` later is never followed. Elsewhere the
    plain path (``tb/`` is then checked at each flush and close)."""
    own = f"/proc/self/fd/{tb_fd}"
    return own if os.path.isdir(own) else str(tb_dir)


# ----------------------------------------------------------------------------- episodes


@dataclass(frozen=True)
class Episode:
    """One finished episode reported by a vector env."""

    env_index: int
    ret: float
    length: int
    success: bool | None


def _host_arrays(values: list[Any]) -> list[np.ndarray | None]:
    """NumPy copies of arrays/tensors, with one device-to-host copy per device for tensors."""
    out: list[np.ndarray | None] = [
        None if v is None or isinstance(v, torch.Tensor) else np.asarray(v) for v in values
    ]
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
    for device, indices in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        flat = torch.cat([values[i].detach().reshape(-1).to(dtype) for i in indices]).cpu()
        for i, chunk in zip(indices, flat.split([values[i].numel() for i in indices]), strict=True):
            out[i] = chunk.numpy().reshape(tuple(values[i].shape))
    return out


class EpisodeTracker:
    """Collects finished episodes from vector env infos and keeps means over the last `window`.

    Reads Gymnasium's `RecordEpisodeStatistics` layout: `info["episode"]["r"|"l"]`
    with mask `info["_episode"]`, and optional success flags `info[success_key]`
    with mask `info["_" + success_key]` (under `info["final_info"]` for
    same-step autoreset). Values may be NumPy arrays or torch tensors.

    Example:
        >>> tracker = EpisodeTracker(window=100)
        >>> obs, reward, term, trunc, info = envs.step(action)
        >>> for episode in tracker.update(info): print(episode.ret)
    """

    def __init__(self, window: int = 100, *, success_key: str = "success") -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.success_key = success_key
        self._returns: deque[float] = deque(maxlen=window)
        self._lengths: deque[int] = deque(maxlen=window)
        self._successes: deque[bool] = deque(maxlen=window)
        self.episodes_seen = 0

    def _success_source(self, info: Mapping[str, Any]) -> tuple[Any, Any]:
        key, mask_key = self.success_key, "_" + self.success_key
        final = info.get("final_info")
        if isinstance(final, Mapping) and key in final:
            # Same-step autoreset: top-level info already belongs to the new episode.
            return final[key], final.get(mask_key, info.get("_final_info"))
        return info.get(key), info.get(mask_key)

    def update(self, info: Mapping[str, Any]) -> list[Episode]:
        """Record the episodes that finished in this step's `info`; return them."""
        stats = info.get("episode")
        if stats is None:
            return []
        success, success_mask = self._success_source(info)
        mask, rets, lens, success, success_mask = _host_arrays(
            [info.get("_episode"), stats["r"], stats["l"], success, success_mask]
        )
        rets, lens = np.atleast_1d(rets), np.atleast_1d(lens)
        if mask is None:
            if rets.size != 1:
                raise ValueError(
                    "info['episode'] holds per-env arrays but info has no '_episode' mask; "
                    "wrap the vector env in gymnasium.wrappers.vector.RecordEpisodeStatistics"
                )
            mask = np.ones(1, dtype=bool)
        mask = np.atleast_1d(mask).astype(bool)
        if success is not None:
            success = np.atleast_1d(success).astype(bool)
            valid = np.ones_like(success) if success_mask is None else success_mask
            success_mask = np.atleast_1d(valid).astype(bool)
        finished = []
        for i in np.flatnonzero(mask):
            flag = bool(success[i]) if success is not None and success_mask[i] else None
            episode = Episode(int(i), float(rets[i]), round(float(lens[i])), flag)
            finished.append(episode)
            self._returns.append(episode.ret)
            self._lengths.append(episode.length)
            if flag is not None:
                self._successes.append(flag)
        self.episodes_seen += len(finished)
        return finished

    @property
    def mean_return(self) -> float | None:
        """Mean return over the last `window` episodes, or None before the first one."""
        return float(np.mean(self._returns)) if self._returns else None

    @property
    def mean_length(self) -> float | None:
        """Mean length over the last `window` episodes, or None before the first one."""
        return float(np.mean(self._lengths)) if self._lengths else None

    @property
    def success_rate(self) -> float | None:
        """Fraction of recent episodes that reported success, or None if none reported it."""
        return float(np.mean(self._successes)) if self._successes else None

    def state_dict(self) -> dict[str, Any]:
        """The window and the count, as plain lists (checkpoint-safe)."""
        return {
            "returns": list(self._returns),
            "lengths": list(self._lengths),
            "successes": list(self._successes),
            "episodes_seen": self.episodes_seen,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a resumed run logs the same window means).
        ValueError naming the entry where a saved window holds anything but its kind of
        value (finite returns, lengths >= 0, booleans), or more values than the window."""
        number = (int, float, np.integer, np.floating)
        kinds = {
            "returns": lambda v: isinstance(v, number) and not isinstance(v, bool)
            and math.isfinite(v),
            "lengths": lambda v: isinstance(v, int | np.integer) and not isinstance(v, bool)
            and v >= 0,
            "successes": lambda v: isinstance(v, bool | np.bool_),
        }  # fmt: skip
        for name, valid in kinds.items():
            values = state[name]
            if not isinstance(values, list | tuple) or len(values) > self._returns.maxlen:
                raise ValueError(
                    f"episodes.{name}: expected a list of at most {self._returns.maxlen} values"
                )
            for value in values:
                if not valid(value):
                    raise ValueError(f"episodes.{name} holds {type(value).__name__} {value!r:.40}")
        seen = state["episodes_seen"]
        if not isinstance(seen, int) or isinstance(seen, bool) or seen < 0:
            raise ValueError(f"episodes.episodes_seen={seen!r:.40}: expected an integer >= 0")
        self._returns.extend(state["returns"])
        self._lengths.extend(state["lengths"])
        self._successes.extend(state["successes"])
        self.episodes_seen = seen

    def metrics(self) -> dict[str, float]:
        """Window means under the standard chart names, for the metrics seen so far."""
        values = {
            EPISODIC_RETURN: self.mean_return,
            EPISODIC_LENGTH: self.mean_length,
            SUCCESS_RATE: self.success_rate,
        }
        return {name: value for name, value in values.items() if value is not None}


# ----------------------------------------------------------------------------- summary


SUMMARY_DIGITS = 6  # significant digits of a float in the summary line (float32 noise dropped)


def _rounded(value: Any) -> Any:
    """``value`` with every float rounded to SUMMARY_DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{SUMMARY_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _json_safe(value: Any) -> Any:
    """Plain JSON values: NaN/inf -> None, tensors and arrays -> numbers or lists."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.item() if value.numel() == 1 and value.dim() == 0 else value.tolist()
    elif isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def print_summary(summary: Mapping[str, Any], *, file: TextIO | None = None) -> None:
    """Print `summary` as one line of JSON on stdout (non-finite floats become null, floats
    keep SUMMARY_DIGITS significant digits) and flush."""
    line = json.dumps(_rounded(_json_safe(summary)), allow_nan=False, default=str)
    stream = file if file is not None else sys.stdout
    print(line, file=stream, flush=True)
