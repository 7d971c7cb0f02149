"""What the benchmark scripts share, in one module that imports no other script.

Training runs in a subprocess (:func:`train`: its summary line and peak RSS), and the timed
SPS and per-update splits read back from its TensorBoard events (:func:`timed`); the suites'
grid of runs (:func:`run_grid`), one process that trains then evaluates
(:func:`train_and_evaluate`), any Python command's summary lines (:func:`run_python`), and
what a finished run logged (:func:`steps_to`, :func:`logged_sps`).

Timed SPS: the trainer logs ``charts/SPS`` = cumulative env steps / wall time since its loop
started, every update, so elapsed(s) = s / SPS(s) and the SPS of the updates after a warm-up
step s_w is (s_end - s_w) / (elapsed(s_end) - elapsed(s_w)): start-up and compilation in the
warm-up are not timed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The MiniGrid image config of benchmarks/speed.py --vary flags, memory.py and image_learner.py
# (the overrides of a popular PPO-TrXL script's MiniGrid setting).
MINIGRID = [
    "env=minigrid_memory",
    "agent=gtrxl",
    "agent.dim=256",
    "agent.layers=2",
    "agent.heads=4",
    "agent.memory=64",
    "algo.num_steps=256",
    "progress=false",
    "tensorboard=true",
    "checkpoint_every=1000000",
    "seed=1",
]


# Run by train(): rltrans.train.main in this process, then the process's peak RSS (Linux: KiB).
CHILD = (
    "import json, resource, sys\n"
    "from rltrans.train import main\n"
    "code = main(sys.argv[1:])\n"
    "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print(json.dumps({'peak_rss_mb': peak / 1024}))\n"
    "sys.exit(code)\n"
)


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run's TensorBoard events: (step, value) in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train(
    args: list[str],
    threads: int | None,
    timeout: float | None,
    checkout: Path = ROOT,
    python: str = sys.executable,
) -> dict:
    """``python -m rltrans.train *args`` in a subprocess: its JSON summary line plus
    ``peak_rss_mb``, the training process's peak resident memory (actor processes excluded),
    and ``notes``, the lines in which its ``auto`` choices reported themselves.
    ``threads`` sets OMP_NUM_THREADS (None: unset, so ``torch_threads=auto`` sees every core);
    ``checkout`` is the code that runs (this one, or another checkout with its ``python``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(max(threads, 1))
    proc = subprocess.run(
        [python, "-c", CHILD, *args],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout} {args}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    auto = ("torch_threads=auto", "compile=auto")  # what the run's auto choices reported
    notes = [line for line in proc.stderr.splitlines() if line.startswith(auto)]
    return {**lines[-2], **lines[-1], "notes": notes}


def timed(run: Path, warmup: int, split: tuple[str, ...]) -> dict[str, float]:
    """Timed SPS after ``warmup`` env steps, the number of timed updates, and the mean per
    timed update of each ``perf/<key>`` in ``split`` (nan where the run did not log it)."""
    tags = scalars(run)
    points = [(s, v) for s, v in tags["charts/SPS"] if s >= warmup]
    if len(points) < 2:
        raise RuntimeError(f"{run}: fewer than 2 updates after the warm-up of {warmup} steps")
    (s1, v1), (s2, v2) = points[0], points[-1]
    out = {"sps": (s2 - s1) / (s2 / v2 - s1 / v1), "updates": len(points) - 1}
    for key in split:
        values = [v for s, v in tags.get(f"perf/{key}", []) if s > s1]
        out[key] = statistics.fmean(values) if values else float("nan")
    return out


# One process per run trains, then evaluates: one interpreter start and torch import, not two.
RUNNER = (
    "import json, sys\n"
    "from rltrans import evaluate, train\n"
    "argv = json.loads(sys.argv[1])\n"
    "sys.exit(train.main(argv['train']) or evaluate.main(argv['evaluate']))\n"
)


def train_and_evaluate(run: Path, train: list[str], evaluate: list[str]) -> tuple[dict, dict]:
    """Train then evaluate in one process (:data:`RUNNER`, one thread); their summary lines."""
    argv = json.dumps({"train": train, "evaluate": evaluate})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, argv], capture_output=True, text=True, env=env
    )
    lines = summaries(done.stdout)
    if done.returncode != 0 or len(lines) != 2:
        raise RuntimeError(f"{run.name}: exited {done.returncode}:\n{done.stderr[-2000:]}")
    return lines[0], lines[1]


def run_python(args: list[str], what: str) -> list[dict]:
    """Run ``python <args>`` (one torch thread); its JSON summary lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what}: exited {done.returncode}:\n{done.stderr[-2000:]}")
    return summaries(done.stdout)


def summaries(out: str) -> list[dict]:
    """The JSON summary lines of a run's output: train's, then evaluate's."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def steps_to(run: Path, tag: str, threshold: float) -> int | None:
    """The first logged step at which ``tag`` reached ``threshold`` (None: never)."""
    from rltrans.plot import read_curve

    curve = read_curve(run, tag, "step")
    hit = [x for x, y in zip(curve.x, curve.y, strict=True) if y >= threshold]
    return int(hit[0]) if hit else None


def logged_sps(run: Path) -> float:
    """The run's last logged speed: a run finished before this call trains nothing now."""
    from rltrans.plot import read_curve

    return float(read_curve(run, "charts/SPS", "step").y[-1])


def run_grid(jobs: int, runs: dict[str, Callable[[], Any]], line: Callable[[Any], str]) -> list:
    """Each named run's result, ``jobs`` at a time (each run starts its own process), with a
    progress line per finished run; the first failure stops the grid and is raised."""
    start, results = time.monotonic(), []
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(call): name for name, call in runs.items()}
        for n, future in enumerate(as_completed(futures), 1):
            if future.exception() is not None:  # stop at the first failure, not after the grid
                pool.shutdown(wait=True, cancel_futures=True)
                raise future.exception()
            results.append(future.result())
            minutes = (time.monotonic() - start) / 60
            print(f"[{n}/{len(runs)} {minutes:.1f} min] {futures[future]}: {line(results[-1])}")
            sys.stdout.flush()
    return results


def named_steps(entries: list[str], names: list[str], option: str, key: str) -> dict[str, int]:
    """``option``'s KEY=STEPS entries (KEY one of ``names``) as a dict; ValueError naming a
    bad entry and the valid names."""
    budgets = {}
    for entry in entries:
        name, _, steps = entry.partition("=")
        if name not in names or not steps.isdigit() or int(steps) <= 0:
            raise ValueError(
                f"{option} {entry!r}: expected {key}=STEPS with STEPS > 0 and {key} one of "
                f"{', '.join(names)}"
            )
        budgets[name] = int(steps)
    return budgets


def ratio_median(values: list[float], reference: list[float]) -> float:
    """Median over rounds of value / reference, round by round (paired: both measured in the
    same round, so a machine whose speed drifts moves both)."""
    return statistics.median(v / r for v, r in zip(values, reference, strict=True))


def paired(rows: list[tuple[str, Any]], rounds: int, measure: Callable) -> dict[str, list]:
    """``measure(name, row, round)`` -> {row name: result} for every row in every round, the
    rows in reversed order every other round; each name's results in round order."""
    results: dict[str, list] = {}
    for r in range(rounds):
        for name, row in rows if r % 2 == 0 else rows[::-1]:
            for key, value in measure(name, row, r).items():
                results.setdefault(key, []).append(value)
    return results


def table(head: list[str], lines: list[list[str]]) -> str:
    """A markdown table."""
    rows = [head, ["---"] * len(head), *lines]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)
