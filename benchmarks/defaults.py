"""Whole runs with the defaults against the old fixed choices, on the vector config.

The config (a popular PPO-TrXL script's small setting, on the T-maze with corridor 30 as the
vector-observation task): agent=trxl with 4 layers x 64, 1 head, memory M=16, 16 envs x 128
steps, PPO's 4 epochs x 8 minibatches. Rows, run one after the other in each round (reversed
every other round):

  * defaults          torch_threads=auto compile=auto (what a user gets)
  * threads=1 eager   torch_threads=1 compile=false (the defaults before the auto choices)

Each row is a whole training run in a subprocess of ``--steps`` env steps; its wall time is
the run's own summary SPS (everything from the first step: thread trials, the compile
decision and compilation included), so the ratio is what a user waits. Printed per row: the
median SPS over rounds, its ratio to threads=1 eager, and the auto choices' report lines.

    python benchmarks/defaults.py [--steps 25000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from common import train

COMMON = [
    "env=tmaze",
    "env.kwargs.length=30",
    "agent=trxl",
    "agent.layers=4",
    "agent.dim=64",
    "agent.heads=1",
    "agent.memory=16",
    "algo.num_steps=128",
    "progress=false",
    "tensorboard=false",
    "seed=1",
]
ROWS = [
    ("defaults", [], None),
    ("threads=1 eager", ["torch_threads=1", "compile=false"], 1),
]


def main() -> None:
    """Run every row ``--rounds`` times, then print the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=25_000, help="env steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over both rows")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    a = parser.parse_args()
    print(
        f"T-maze 30, trxl 4 x 64 x 1 head, M=16, 16 envs x 128 steps, {a.steps} env steps per"
        f" run, {a.rounds} rounds, {os.cpu_count()} cores",
        flush=True,
    )
    sps: dict[str, list[float]] = {name: [] for name, _, _ in ROWS}
    with tempfile.TemporaryDirectory(prefix="rltrans-bench-defaults-") as tmp:
        for r in range(a.rounds):
            for name, extra, threads in ROWS if r % 2 == 0 else ROWS[::-1]:
                run = Path(tmp) / f"{name.replace(' ', '_').replace('=', '-')}-{r}"
                args = [*COMMON, *extra, f"total_steps={a.steps}", f"run_dir={run}"]
                summary = train(args, threads, a.timeout)
                sps[name].append(summary["SPS"])
                notes = "".join(f"\n    {note}" for note in summary["notes"])
                print(f"  round {r} {name}: {summary['SPS']:.0f} SPS{notes}", flush=True)
    old = statistics.median(sps["threads=1 eager"])
    print(f"\n{'row':<18} {'SPS':>7} {'x threads=1 eager':>18}")
    for name, values in sps.items():
        median = statistics.median(values)
        print(f"{name:<18} {median:>7.0f} {median / old:>18.2f}")


if __name__ == "__main__":
    main()
