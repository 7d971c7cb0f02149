r"""Learning results: memory policies against the memoryless control, through the real CLI.

Each run is `python -m rltrans.train` (in-process) with the overrides below; the
learning curve is read back from the run's TensorBoard events. Printed per run:
steps to reach the threshold (or "-"), final metric, SPS.

Tasks: T-maze with corridor 30 (success rate, threshold 0.95), repeat-previous
(return, threshold 0.9), CartPole-v1 through the Gymnasium path (return, threshold 475).
Steps and wall time to the threshold come from the run's own logs (wall time = step / the
cumulative charts/SPS logged at that step).

    python benchmarks/learning.py                                  # everything, 3 seeds
    python benchmarks/learning.py --tasks tmaze30 --agents gtrxl mlp --seeds 1 --steps 300000
    python benchmarks/learning.py --algo impala --runtime process --tasks cartpole tmaze30 \
        --agents mlp gtrxl --steps 1000000                         # IMPALA, actor processes
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rltrans.train import main as train

TASKS = {
    "tmaze30": {
        "overrides": ["env=tmaze", "env.kwargs.length=30"],
        "metric": "charts/success_rate",
        "threshold": 0.95,
    },
    "repeat_previous": {
        "overrides": ["env=repeat_previous"],
        "metric": "charts/episodic_return",
        "threshold": 0.9,
    },
    "cartpole": {
        "overrides": ["env=gym", "env.id=CartPole-v1"],
        "algo_overrides": {"ppo": ["env.num_envs=8"]},  # IMPALA: the env config's default
        "metric": "charts/episodic_return",
        "threshold": 475.0,
    },
}
AGENT_OVERRIDES = {
    "gtrxl": ["agent=gtrxl", "agent.memory=32"],
    "trxl": ["agent=trxl", "agent.memory=32"],
    # rotary instead of xl relative positions
    "gtrxl_rotary": ["agent=gtrxl", "agent.memory=32", "agent.position=rotary"],
    "lstm": ["agent=lstm"],
    "mlp": ["agent=mlp"],
    # cue and turn of the corridor-30 T-maze in one training segment (memory is stop-gradient)
    "ut_act": ["agent=ut_act", "algo.segment_length=64"],
}


def curve(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one scalar from a run's TensorBoard events."""
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if metric not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(metric)]


def run(
    task: str,
    agent: str,
    seed: int,
    steps: int,
    root: Path,
    algo: str = "ppo",
    runtime: str = "local",
) -> dict:
    """Train once and summarise the learning curve."""
    spec = TASKS[task]
    run_dir = root / f"{task}-{agent}-{algo}-{runtime}-s{seed}"
    args = [
        *AGENT_OVERRIDES[agent],
        *spec["overrides"],
        *spec.get("algo_overrides", {}).get(algo, []),
        f"algo={algo}",
        f"runtime={runtime}",
        f"seed={seed}",
        f"total_steps={steps}",
        f"run_dir={run_dir}",
        "progress=false",
        "torch_threads=1",
        "checkpoint_every=1000000",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train(args)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    points = curve(run_dir, spec["metric"])
    reached = next((s for s, v in points if v >= spec["threshold"]), None)
    final = points[-1][1] if points else float("nan")
    seconds = None
    if reached is not None:  # cumulative SPS at that step: elapsed = step / SPS
        sps = dict(curve(run_dir, "charts/SPS"))
        at = min(sps, key=lambda s: abs(s - reached))
        seconds = at / sps[at]
    return {
        "steps_to_threshold": reached,
        "seconds_to_threshold": seconds,
        "final": final,
        "SPS": summary["SPS"],
    }


def main() -> None:
    """Run the grid and print one row per run plus per-(task, agent) means."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument(
        "--agents", nargs="+", default=["gtrxl", "lstm", "mlp"], choices=list(AGENT_OVERRIDES)
    )
    p.add_argument("--seeds", type=int, default=3, help="how many seeds")
    p.add_argument(
        "--first-seed", type=int, default=1, help="seeds run from here (split seeds over processes)"
    )
    p.add_argument("--steps", type=int, default=500_000)
    p.add_argument("--algo", default="ppo", choices=["ppo", "impala", "impala_paper"])
    p.add_argument("--runtime", default="local", choices=["local", "process", "ray"])
    p.add_argument("--out", default=None, help="keep the runs here (default: a temp dir)")
    args = p.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rltrans-learning-"))
    setting = f"algo={args.algo} runtime={args.runtime}"
    print(f"# runs in {root}; {args.steps} env steps per run; {setting}")
    head = f"{'task':16s} {'agent':12s} {'seed':>4s} {'to threshold':>12s} {'seconds':>8s}"
    print(f"{head} {'final':>8s} {'SPS':>6s}")
    for task in args.tasks:
        for agent in args.agents:
            finals = []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                r = run(task, agent, seed, args.steps, root, args.algo, args.runtime)
                finals.append(r["final"])
                reach = f"{r['steps_to_threshold']:,}" if r["steps_to_threshold"] else "-"
                secs = r["seconds_to_threshold"]
                secs = f"{secs:.0f}" if secs is not None else "-"
                row = f"{task:16s} {agent:12s} {seed:4d} {reach:>12s} {secs:>8s}"
                print(f"{row} {r['final']:8.3f} {r['SPS']:6.0f}", flush=True)
            mean = statistics.mean(finals)
            print(f"{task:16s} {agent:12s} mean {'':>12s} {'':>8s} {mean:8.3f}", flush=True)


if __name__ == "__main__":
    main()
