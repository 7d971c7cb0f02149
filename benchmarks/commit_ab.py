"""PPO SPS of this checkout against another one (an earlier commit), measured in one run.

A refactor that should not change speed is checked here: the same training command runs in
both checkouts, base and head in each round (which goes first alternates) so that the
machine's drift falls on both, and the ratio head / base is the median of the per-round
ratios. SPS is timed
after one warm-up update (benchmarks/common.py), so start-up is not counted.

    git worktree add /tmp/base <commit>      # with its own venv: python -m venv, pip install -e .
    python benchmarks/commit_ab.py --base /tmp/base --rounds 3

Configs: ``vector`` is the small PPO config of benchmarks/throughput.py (T-maze, TrXL 4 layers x
64, 1 head, M=16, 16 envs x 128 steps, 8 minibatches x 4 epochs); ``minigrid`` is
benchmarks/common.py's MiniGrid image config. Both run eager with one thread, so the figures
compare the code, not the auto choices.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import CHILD, MINIGRID, ROOT, timed

STEADY = ["torch_threads=1", "compile=false", "progress=false", "tensorboard=true"]
CONFIGS = {
    "vector": (
        [
            "env=tmaze", "agent=trxl", "agent.dim=64", "agent.layers=4", "agent.heads=1",
            "agent.memory=16", "env.num_envs=16", "algo.num_steps=128",
            "algo.num_minibatches=8", "algo.epochs=4", "seed=1",
        ],
        2048,  # env steps per update
    ),
    "minigrid": ([a for a in MINIGRID if not a.startswith(("progress", "tensorboard"))], 4096),
}  # fmt: skip


def python_of(checkout: Path) -> str:
    """The checkout's own interpreter (its .venv), else this one."""
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def sps(checkout: Path, args: list[str], per_update: int, updates: int, out: Path) -> float:
    """Timed SPS of one run of ``args`` with ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    budget = [f"total_steps={per_update * (updates + 1)}", f"run_dir={out}"]
    proc = subprocess.run(
        [python_of(checkout), "-c", CHILD, *args, *STEADY, *budget],
        env=env, cwd=checkout, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return timed(out, per_update, ())["sps"]


def main() -> None:
    """Alternate base and head per round; print each round and the median ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=4, help="timed updates per run")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in opts.configs:
            args, per_update = CONFIGS[name]
            ratios = []
            for r in range(opts.rounds):
                sides = [("base", opts.base), ("head", ROOT)]
                measured = {}
                for side, checkout in sides if r % 2 == 0 else sides[::-1]:  # order alternates
                    out = Path(tmp, f"{name}-{side}-{r}")
                    measured[side] = sps(checkout, args, per_update, opts.updates, out)
                base, head = measured["base"], measured["head"]
                ratios.append(head / base)
                print(f"{name} round {r + 1}: base {base:.0f} SPS, head {head:.0f} SPS, "
                      f"head/base {head / base:.3f}", flush=True)  # fmt: skip
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{name}: head/base median {statistics.median(ratios):.3f} (rounds {spread})")


if __name__ == "__main__":
    main()
