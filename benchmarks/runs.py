"""What the throughput benchmarks share: a training run in a subprocess (its summary line and
peak RSS), and the timed SPS and per-update splits read back from its TensorBoard events.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The MiniGrid image config of benchmarks/minigrid.py, memory.py and image_learner.py (the
# overrides of a popular PPO-TrXL script's MiniGrid setting).
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


def unshadow_minigrid() -> None:
    """Take this folder off ``sys.path``: a script run from it has it first there, and its
    minigrid.py would be imported in place of the minigrid package by an in-process env."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


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


def train(args: list[str], threads: int | None, timeout: float) -> dict:
    """``python -m rltrans.train *args`` in a subprocess: its JSON summary line plus
    ``peak_rss_mb``, the training process's peak resident memory (actor processes excluded),
    and ``notes``, the lines in which its ``auto`` choices reported themselves.
    ``threads`` sets OMP_NUM_THREADS (None: unset, so ``torch_threads=auto`` sees every core)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(max(threads, 1))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=env,
        cwd=ROOT,  # not the caller's folder: benchmarks/minigrid.py would shadow the package
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
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
