"""What compile=auto costs or saves a user's first run: the same command line with
``compile=auto`` (the default) and ``compile=false``, one after the other, as wall-time ratios
measured in the same window, optionally beside a CPU-bound process on every other core (a
busy machine). Each run of ``auto`` starts with no remembered decision (its own
``RLTRANS_COMPILE_MEMORY`` file), as a new user's does; ``--remembered`` runs ``auto`` once
more with the decision the first one kept.

    python benchmarks/compile_cost.py --env CartPole-v1 --steps 100000 --hog
    python benchmarks/compile_cost.py --env popgym:popgym-RepeatPreviousEasy-v0 --hog \\
        --settings auto false true
    python benchmarks/compile_cost.py --steps 400000 --settings auto --run agent=gru
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOG = "while True: pass"


def run(env_id: str, steps: int, setting: str, memory: Path, extra: list[str]) -> dict:
    """One training run; its wall time, summary line and compile=auto's lines."""
    with tempfile.TemporaryDirectory() as folder:
        command = [
            sys.executable, "-m", "rltrans.train", "env=gym", f"env.id={env_id}",
            f"total_steps={steps}", f"compile={setting}", "progress=false", "tensorboard=false",
            f"run_dir={folder}/run", *extra,
        ]  # fmt: skip
        env = {**os.environ, "RLTRANS_COMPILE_MEMORY": str(memory)}
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    said = [line for line in done.stderr.splitlines() if line.startswith("compile=")]
    return {"setting": setting, "wall_s": wall, "SPS": summary["SPS"], "said": said}


def main() -> None:
    """Run the settings in turn (with the hog, if asked) and print each and the ratios."""
    raw = argparse.RawTextHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--env", default="CartPole-v1", help="a Gymnasium id (module:Id too)")
    parser.add_argument("--steps", type=int, default=100_000, help="total_steps of each run")
    parser.add_argument("--settings", nargs="+", default=["auto", "false"])
    parser.add_argument("--hog", action="store_true", help="a CPU-bound process per other core")
    parser.add_argument("--remembered", action="store_true", help="auto again, remembering")
    parser.add_argument("--run", nargs="*", default=[], help="more overrides for every run")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    hogs = [
        subprocess.Popen([sys.executable, "-c", HOG])
        for _ in range(max(1, (cores or 2) - 1) if args.hog else 0)
    ]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            memory = Path(folder) / "rltrans-compile.json"
            for setting in args.settings:
                fresh = Path(folder) / f"fresh-{setting}.json"  # no decision remembered yet
                rows.append(run(args.env, args.steps, setting, fresh, args.run))
                print(json.dumps(rows[-1]), flush=True)
                if setting == "auto" and args.remembered:
                    if fresh.exists():
                        memory.write_bytes(fresh.read_bytes())
                    again = run(args.env, args.steps, "auto", memory, args.run)
                    again["setting"] = "auto (remembered)"
                    rows.append(again)
                    print(json.dumps(again), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    base = next((r for r in rows if r["setting"] == "false"), None)
    print(f"\n{args.env}, {args.steps:,} steps, {'with' if hogs else 'without'} a CPU hog")
    for row in rows:
        ratio = f"{row['wall_s'] / base['wall_s']:.2f}x compile=false's wall time" if base else ""
        print(f"  compile={row['setting']:<18} {row['wall_s']:7.1f} s  {ratio}")


if __name__ == "__main__":
    main()
