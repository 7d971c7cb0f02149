"""PPO on MiniGrid Memory from 84x84 RGB images: SPS and peak memory of the defaults against
each speed flag, in one run.

The config (a popular PPO-TrXL script's MiniGrid setting): env=minigrid_memory (MiniGrid-
MemoryS9-v0, agent_view_size=3, RGBImgPartialObsWrapper(tile_size=28), ImgObsWrapper, a
96-step TimeLimit, 16 envs), agent=gtrxl with 2 layers x 256, 4 heads, memory M=64, the Nature
CNN encoder, algo.num_steps=256 (4,096 env steps per update; PPO's 4 epochs x 8 minibatches).
Rows (each a real training run in a subprocess, ``--warmup`` updates then ``--updates`` timed):

  * defaults          no flags: what a user gets
  * threads=1 eager   torch_threads=1 compile=false (the defaults before `auto` choices)
  * one row per ``--flags`` entry (default: torch_threads=2, compile=true, and both)

Printed per row: timed SPS (updates after the warm-up, so compilation is not timed) and its
ratio to the defaults and to the threads=1 eager row, the mean env / act / learn ms per update
(perf/*), and the peak RSS of the training process. Needs the minigrid extra.

    python benchmarks/minigrid.py [--updates 3] [--warmup 1] [--flags "torch_threads=2" ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from common import MINIGRID as COMMON
from common import timed, train

STEPS_PER_UPDATE = 16 * 256
SPLIT = ("env_ms", "act_ms", "learn_ms")
FLAGS = ["torch_threads=2", "compile=true", "torch_threads=2 compile=true"]


def main() -> None:
    """Run every row once, then print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--updates", type=int, default=3, help="timed updates per row")
    parser.add_argument("--warmup", type=int, default=1, help="updates before timing (>= 1)")
    parser.add_argument("--flags", nargs="*", default=FLAGS, help="one row per entry")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    a = parser.parse_args()
    warmup = max(a.warmup, 1) * STEPS_PER_UPDATE
    total = warmup + a.updates * STEPS_PER_UPDATE
    table = [("defaults", []), ("threads=1 eager", ["torch_threads=1", "compile=false"])]
    table += [(flags, flags.split()) for flags in a.flags]
    print(
        f"MiniGrid-MemoryS9-v0 84x84x3, gtrxl 2 x 256 x 4 heads, M=64, 16 envs x 256 steps;"
        f" {a.warmup} warm-up + {a.updates} timed updates per row, {os.cpu_count()} cores",
        flush=True,
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="rltrans-bench-minigrid-") as tmp:
        for name, extra in table:
            run = Path(tmp) / name.replace(" ", "_").replace("=", "-")
            # OMP_NUM_THREADS as the row's torch_threads; unset for auto (every core offered)
            threads = next((int(x.split("=")[1]) for x in extra if "torch_threads=" in x), None)
            summary = train(
                [*COMMON, *extra, f"total_steps={total}", f"run_dir={run}"], threads, a.timeout
            )
            row = timed(run, warmup, SPLIT)
            row["peak_rss_mb"] = summary["peak_rss_mb"]
            results[name] = row
            print(
                f"  {name}: {row['sps']:.1f} SPS timed, peak RSS {row['peak_rss_mb']:.0f} MB",
                *(f"\n    {note}" for note in summary["notes"]),
                sep="",
                flush=True,
            )

    base, old = results["defaults"]["sps"], results["threads=1 eager"]["sps"]
    head = (
        f"{'row':<30} {'SPS':>6} {'x defaults':>10} {'x t1 eager':>10} {'env ms':>8}"
        f" {'act ms':>8} {'learn ms':>9} {'peak RSS MB':>11}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for name, row in results.items():
        print(
            f"{name:<30} {row['sps']:>6.1f} {row['sps'] / base:>10.2f} {row['sps'] / old:>10.2f}"
            f" {row['env_ms']:>8.0f} {row['act_ms']:>8.0f} {row['learn_ms']:>9.0f}"
            f" {row['peak_rss_mb']:>11.0f}"
        )
    print(
        "\nSPS: wall-clock env steps/s of the timed updates (from charts/SPS); ms: mean per"
        " update; peak RSS: the training process's maximum resident set (ru_maxrss)."
    )


if __name__ == "__main__":
    main()
