"""python -m rltrans.plot <run dir> [<run dir> ...] [tag=charts/episodic_return] [out=curves.png]
[csv=curves.csv] [x=step]

Learning curves from run folders without TensorBoard: reads one scalar ``tag`` from each
run's TensorBoard events (``<run>/tb``, read with TensorBoard's ``EventAccumulator``, so a
resumed run's purged events stay hidden as TensorBoard hides them), groups the runs of one
config (the same ``config.yaml`` up to the seed and the knobs that change how a run goes, not
what it learns: run_dir, resume, overwrite, progress, tensorboard, device, torch_threads,
compile, checkpoint_every, keep_checkpoints) and draws one line per group: the mean over its
seeds with a 95 % band: the percentile bootstrap interval of the mean over the seeds. It
never leaves the seeds' own range (with two seeds it is that range), so it stays within the
metric's; a t interval with 2 or 3 seeds is many times wider. Each run's curve is
linearly interpolated onto the group's grid (every x a run of the group logged); at each x
the seeds whose curves span it count. Lines are labelled by the fewest config keys that tell
the groups apart (what a run is, such as ``agent.backbone``, first).

Options (``key=value``, anywhere among the run folders):

    tag   the scalar to plot (default charts/episodic_return; an error lists a run's tags)
    out   the PNG to write (default curves.png; needs matplotlib: pip install "rltrans[plot]")
    csv   the CSV of the same data: group, step, mean, low, high, n_seeds (default curves.csv;
          with x=time the step column holds seconds)
    x     step (the logged global step) or time (seconds since the run's first value of tag)

Prints one JSON line (files, tag, groups). A bad argument prints one ``error: ...`` line and
exits with code 2. The command line is parsed here, not by rltrans.cli.run_cli: run_cli
composes a Hydra config checked by the schema of rltrans.config, which has no place for the
run folders (positional arguments) and would need a schema table for four plain options.

Example:
    python -m rltrans.plot runs/gtrxl-s1 runs/gtrxl-s2 runs/lstm-s1 runs/lstm-s2 out=tmaze.png
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import stat
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rltrans import fsutil
from rltrans.config import ConfigError, read_yaml
from rltrans.config.errors import first_line
from rltrans.config.spec import format_value
from rltrans.run.logging import print_summary

OPTIONS = {"tag": "charts/episodic_return", "out": "curves.png", "csv": "curves.csv", "x": "step"}
X_AXES = ("step", "time")
# Left out of a group's config: the seed, and knobs that change how a run goes, not what it
# learns (where it writes, on which device and threads, how often it checkpoints).
RUN_KNOBS = (
    "seed", "run_dir", "resume", "overwrite", "progress", "tensorboard", "device",
    "torch_threads", "compile", "checkpoint_every", "keep_checkpoints",
)  # fmt: skip
RESAMPLES = 10_000  # bootstrap resamples of the seeds at each x (a fixed RNG: same band each time)
# Keys that name what a run is; a label uses them first where they tell the groups apart.
NAMING = ("agent.backbone", "agent.kind", "algo.kind", "env.name", "env.id", "dataset")


class PlotError(ValueError):
    """A bad argument or run folder, explained for the user (exit code 2)."""


@dataclass(frozen=True)
class Curve:
    """One run's values of the tag, sorted by x, one value per x."""

    run: Path
    x: np.ndarray  # (P,) float64, increasing
    y: np.ndarray  # (P,) float64


@dataclass(frozen=True)
class Group:
    """The runs of one config and their mean curve on the group's grid of G points."""

    label: str
    runs: list[Path]
    x: np.ndarray  # (G,)
    mean: np.ndarray  # (G,)
    low: np.ndarray  # (G,) lower end of the 95 % bootstrap band (= mean with one seed)
    high: np.ndarray  # (G,)
    n: np.ndarray  # (G,) int, seeds whose curve spans each x


# ------------------------------------------------------------------------------ reading runs


def parse_args(argv: Sequence[str]) -> tuple[list[Path], dict[str, str]]:
    """Run folders and options (``key=value`` for a key of OPTIONS) from the command line."""
    runs, options = [], dict(OPTIONS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in OPTIONS:
            options[key] = value
        elif sep and not Path(arg).exists():
            valid = ", ".join(f"{k}=" for k in OPTIONS)
            raise PlotError(f"{arg}: neither a run folder nor an option; options: {valid}")
        else:
            runs.append(Path(arg))
    if not runs:
        raise PlotError("no run folders given: python -m rltrans.plot runs/<a> runs/<b> ...")
    if options["x"] not in X_AXES:
        raise PlotError(f"x={options['x']}: expected one of: {', '.join(X_AXES)}")
    for key in ("tag", "out", "csv"):
        if not options[key]:
            raise PlotError(f"{key}= is empty; default: {key}={OPTIONS[key]}")
    return runs, options


def flat_config(run: Path) -> dict[str, Any]:
    """The run's config.yaml as ``{dotted.key: value}`` without the RUN_KNOBS."""
    path = run / "config.yaml"
    if not os.path.lexists(path) or path.is_dir():
        raise PlotError(
            f"{run}: not a run folder (no config.yaml); give folders rltrans.train wrote"
        )
    try:
        data = read_yaml(path)  # bounded in size and depth, safe loader
    except ConfigError as err:
        raise PlotError(str(err)) from None
    if not isinstance(data, dict):
        raise PlotError(f"{path}: not a run config (a mapping of config groups)")
    flat: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(data, "")
    return {k: v for k, v in flat.items() if k not in RUN_KNOBS}


def read_curve(run: Path, tag: str, x: str) -> Curve:
    """The run's logged values of ``tag`` against the step or the seconds since its first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = run / "tb"
    if not tb.is_dir() or not any(p.name.startswith("events.out.tfevents") for p in tb.iterdir()):
        raise PlotError(f"{run}: no TensorBoard events in {tb} (trained with tensorboard=false?)")
    refuse_special_events(tb)
    # Keep every scalar (the default keeps a sample of 10,000) and no histograms or images.
    keep = {"scalars": 0, "histograms": 1, "images": 1, "audio": 1, "tensors": 1}
    # Quiet: TensorBoard logs a warning for the events it hides after a resume (purge_step).
    try:
        with _quiet("tensorboard"):
            events = EventAccumulator(str(tb), size_guidance=keep).Reload()
    except Exception as err:  # TensorBoard's readers raise many types on damaged files
        first = first_line(err, 200)
        raise PlotError(
            f"{tb}: the events cannot be read ({type(err).__name__}: {first})"
        ) from None
    tags = events.Tags().get("scalars", [])
    if tag not in tags:
        raise PlotError(
            f"tag={tag}: {run} logged no such scalar; its tags: {', '.join(sorted(tags)) or 'none'}"
        )
    scalars = sorted(events.Scalars(tag), key=lambda e: e.wall_time)
    start = scalars[0].wall_time
    # One value per x, the last one written (a resumed run may log a step twice).
    by_x = {float(e.step if x == "step" else e.wall_time - start): e.value for e in scalars}
    xs = np.array(sorted(by_x), dtype=np.float64)
    ys = np.array([by_x[v] for v in xs], dtype=np.float64)
    finite = np.isfinite(ys)
    return Curve(run, xs[finite], ys[finite])


def refuse_special_events(tb: Path) -> None:
    """PlotError when ``tb`` is a link or holds an event file (any name TensorBoard reads:
    one with ``tfevents`` in it) that is a link or not a regular file: TensorBoard would open
    a FIFO for a blocking read and wait forever."""
    if tb.is_symlink():
        raise PlotError(f"{tb} is a symbolic link; a run folder's tb/ must be a real folder")
    for entry in os.scandir(tb):
        mode = entry.stat(follow_symlinks=False).st_mode
        if "tfevents" in entry.name and not stat.S_ISREG(mode):
            raise PlotError(
                f"{entry.path} is {fsutil.kind(mode)}, not a regular file; TensorBoard event "
                "files are read only from regular files"
            )


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Only errors from the named stdlib logger while the block runs."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# --------------------------------------------------------------------------- groups and means


def group_runs(configs: dict[Path, dict[str, Any]]) -> list[tuple[str, list[Path]]]:
    """Runs with equal configs together, in the order given, each group labelled by
    :func:`telling_keys` of the keys whose values differ between groups."""
    groups: dict[str, list[Path]] = {}
    for run, cfg in configs.items():
        groups.setdefault(repr(sorted(cfg.items(), key=str)), []).append(run)
    firsts = [configs[runs[0]] for runs in groups.values()]
    keys = telling_keys(firsts)
    labels = [
        " ".join(f"{k}={format_value(cfg[k])}" for k in keys if k in cfg) or "all runs"
        for cfg in firsts
    ]
    return list(zip(labels, groups.values(), strict=True))


def telling_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The fewest keys, taken greedily, whose values tell ``configs`` apart: among the keys
    that differ (those every config has, else all), the naming keys first, then the keys
    that split the configs into the most distinct values."""
    missing = object()
    keys = sorted({k for cfg in configs for k in cfg})
    values = {k: [repr(cfg.get(k, missing)) for cfg in configs] for k in keys}
    differ = [k for k in keys if len(set(values[k])) > 1]
    differ = [k for k in differ if all(k in cfg for cfg in configs)] or differ
    order = sorted(differ, key=lambda k: (k not in NAMING, -len(set(values[k])), k))
    chosen: list[str] = []
    for key in order:
        if len(set(zip(*(values[k] for k in chosen), strict=True))) == len(configs):
            break
        chosen.append(key)
    return sorted(chosen, key=lambda k: (k not in NAMING, k))


def mean_band(label: str, curves: list[Curve]) -> Group:
    """The group's mean curve and 95 % bootstrap band over its seeds (:func:`bootstrap_band`)
    on the union of their x values."""
    grid = np.unique(np.concatenate([c.x for c in curves]))  # (G,)
    values = np.full((len(curves), len(grid)), np.nan)  # (S, G): seeds x grid
    for i, c in enumerate(curves):
        spans = (grid >= c.x[0]) & (grid <= c.x[-1])
        values[i, spans] = np.interp(grid[spans], c.x, c.y)
    n = np.isfinite(values).sum(axis=0)  # (G,)
    mean = np.nanmean(values, axis=0)
    low, high = mean.copy(), mean.copy()
    rng = np.random.default_rng(0)
    picks = {}  # seeds -> (RESAMPLES, seeds) indices, drawn once per count
    for j in np.flatnonzero(n >= 2):
        seeds = values[np.isfinite(values[:, j]), j]
        if len(seeds) not in picks:
            picks[len(seeds)] = rng.integers(0, len(seeds), (RESAMPLES, len(seeds)))
        low[j], high[j] = bootstrap_band(seeds, picks[len(seeds)])
    runs = [c.run for c in curves]
    return Group(label, runs, grid, mean, low, high, n)


def bootstrap_band(seeds: np.ndarray, picks: np.ndarray) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles of the mean of ``seeds`` resampled with replacement
    (``picks``: (B, S) indices): the percentile bootstrap's 95 % interval of the mean."""
    means = seeds[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(max(low, seeds.min())), float(min(high, seeds.max()))


# --------------------------------------------------------------------------------- outputs


def write_csv(path: Path, groups: list[Group]) -> None:
    """One row per group and grid point: group, step, mean, low, high, n_seeds. Written
    atomically, never through a link (see :func:`rltrans.fsutil.write_file`)."""
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(["group", "step", "mean", "low", "high", "n_seeds"])
    for g in groups:
        for row in zip(g.x, g.mean, g.low, g.high, g.n, strict=True):
            out.writerow([g.label, *(f"{v:.10g}" for v in row[:4]), int(row[4])])
    fsutil.write_file(path, lambda f: f.write(text.getvalue().encode()))


def draw_png(path: Path, groups: list[Group], tag: str, x: str) -> None:
    """The curves with their bands as a PNG (matplotlib's Agg canvas, no window)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for g in groups:
        seeds = int(g.n.max())
        label = textwrap.fill(f"{g.label} ({seeds} seed{'s' * (seeds > 1)})", 90)
        (line,) = ax.plot(g.x, g.mean, label=label)
        ax.fill_between(g.x, g.low, g.high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("step" if x == "step" else "seconds since the run's first value")
    ax.set_ylabel(tag)
    several = any(int(g.n.max()) > 1 for g in groups)
    title = "mean over seeds, 95 % bootstrap band" if several else "one seed a line: no band"
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    # Below the axes: labels of several differing keys are long.
    fig.legend(loc="outside lower center", fontsize="small")
    fsutil.write_file(path, lambda f: fig.savefig(f, format="png", dpi=120))


def _check_matplotlib() -> None:
    """PlotError naming the extra where matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(
            'the PNG needs matplotlib, which is not installed: pip install "rltrans[plot]"'
        ) from None


def plot(argv: Sequence[str]) -> dict[str, Any]:
    """Read the runs, write the PNG and CSV, and return the summary."""
    runs, options = parse_args(argv)
    _check_matplotlib()
    tag, x = options["tag"], options["x"]
    configs = {run: flat_config(run) for run in runs}
    curves = {run: read_curve(run, tag, x) for run in runs}
    empty = [str(run) for run, c in curves.items() if not len(c.x)]
    if empty:
        raise PlotError(f"tag={tag}: no finite value logged in {', '.join(empty)}")
    groups = [
        mean_band(label, [curves[r] for r in members]) for label, members in group_runs(configs)
    ]
    out, table = Path(options["out"]), Path(options["csv"])
    try:
        for path in (out, table):  # both checked before either is written
            fsutil.check_output(path)
        draw_png(out, groups, tag, x)
        write_csv(table, groups)
    except (fsutil.UnsafePathError, fsutil.StorageError) as err:  # a link; a full disk
        raise PlotError(str(err)) from None
    except (OSError, ValueError) as err:  # a folder, a read-only place, a name the OS refuses
        raise PlotError(f"cannot write {out} or {table}: {err}") from None
    return {
        "png": str(out),
        "csv": str(table),
        "tag": tag,
        "x": x,
        "groups": [
            {"label": g.label, "runs": [str(r) for r in g.runs], "points": len(g.x)} for g in groups
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: plot, print one JSON line; 2 and one ``error:`` line for a bad argument."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    if "--version" in argv:
        from rltrans.version import __version__

        print(f"rltrans {__version__}")
        return 0
    try:
        summary = plot(argv)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
