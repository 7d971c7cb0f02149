"""Decision Transformer learning: achieved return against target return, DT against BC.

For each environment, through the command-line tools (in-process):

1. ``rltrans.collect`` writes a mixed-quality Minari dataset: a scripted controller that needs
   no training (``rltrans.envs.scripted``: CartPole-v1 state feedback reaching 500, Pendulum-v1
   energy swing-up) with its actions replaced by random ones with probability epsilon in
   ``{0, 0.2, 0.3|0.5, 1}`` (expert, noisy and uniform random episodes, equal numbers);
2. ``rltrans.train agent=dt`` and ``agent=bc`` train on it for ``--steps`` gradient steps at
   the paper's configuration (batch 64, K 20, 128-dim, 3 layers, 1 head, dropout 0.1), one run
   per seed; the final evaluation conditions DT on 5 targets evenly spaced above the data's
   worst return up to its best (all targets in one vector env), BC on the best;
3. prints achieved return per target (mean and spread over seeds), the Spearman correlation
   between target and achieved return (per seed, 5 targets), DT at the best target as a
   fraction of the best return in the data, and DT against BC.

    python benchmarks/dt_learning.py [--steps 5000] [--seeds 1 2 3] [--envs cartpole pendulum]
    python benchmarks/dt_learning.py --quick     # a few minutes: 1 seed, 600 steps, CartPole

Datasets and runs go to a temporary folder (``--out`` keeps them).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rltrans.collect import main as collect_main
from rltrans.train import main as train_main


@dataclass(frozen=True)
class Task:
    """One environment's dataset recipe."""

    name: str
    env_id: str
    controller: str
    epsilons: tuple[float, ...]
    episodes: int


TASKS = {
    "cartpole": Task(
        "CartPole-v1",
        "CartPole-v1",
        "rltrans.envs.scripted:CartPoleController",
        (0, 0.2, 0.3, 1),
        120,
    ),
    "pendulum": Task(
        "Pendulum-v1",
        "Pendulum-v1",
        "rltrans.envs.scripted:PendulumController",
        (0, 0.2, 0.5, 1),
        120,
    ),
}


def cli(main, args: list[str]) -> dict:
    """Run a CLI entry point in-process; its one JSON summary line as a dict."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    if code != 0 or len(lines) != 1:
        raise RuntimeError(f"{main.__module__} {' '.join(args)} exited {code}: {out.getvalue()}")
    return json.loads(lines[0])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); nan if either side is constant."""

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties share their mean rank
            tie = v == value
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def run_task(key: str, args, root: Path) -> dict:
    """Collect, train DT and BC per seed, return the raw results."""
    task = TASKS[key]
    dataset = f"bench/{key}-mixed-v0"
    epsilons = "[" + ",".join(str(e) for e in task.epsilons) + "]"
    data = cli(
        collect_main,
        [
            f"dataset_id={dataset}",
            f"env_id={task.env_id}",
            f"policy={task.controller}",
            f"epsilon={epsilons}",
            f"episodes={task.episodes}",
            "num_envs=10",
            "overwrite=true",
            "progress=false",
        ],
    )
    common = [
        f"dataset={dataset}",
        f"train_steps={args.steps}",
        f"algo.batch_size={args.batch}",
        f"algo.eval_episodes={args.eval_episodes}",
        "algo.eval_every=0",
        f"algo.log_every={max(1, args.steps // 10)}",
        "tensorboard=false",
        f"progress={str(args.progress).lower()}",
        f"torch_threads={args.threads}",
    ]
    dt, bc = [], []
    for seed in args.seeds:
        t0 = time.perf_counter()
        runs = {agent: f"run_dir={root / f'{key}-{agent}-s{seed}'}" for agent in ("dt", "bc")}
        dt_args = ["agent=dt", "algo.eval_num_targets=5", f"seed={seed}", runs["dt"]]
        dt.append(cli(train_main, [*dt_args, *common]))
        bc_args = ["agent=bc", f"algo.eval_targets=[{data['max_return']}]", f"seed={seed}"]
        bc.append(cli(train_main, [*bc_args, runs["bc"], *common]))
        print(f"  {task.name} seed {seed}: DT and BC done in {time.perf_counter() - t0:.0f} s",
              flush=True)  # fmt: skip
    return {"task": task, "data": data, "dt": dt, "bc": bc}


def report(result: dict) -> list[str]:
    """Table lines for one environment."""
    task, data, dt, bc = result["task"], result["data"], result["dt"], result["bc"]
    targets = [float(t) for t in dt[0]["eval_targets"]]
    achieved = np.array(
        [[run["return_by_target"][f"{t:g}"] for t in targets] for run in dt]
    )  # (seeds, targets)
    bc_ret = np.array([next(iter(run["return_by_target"].values())) for run in bc])
    best = float(data["max_return"])
    lines = [
        f"\n{task.name}: {data['episodes']} episodes, {data['steps']} steps, returns "
        f"min {data['min_return']:.1f} / mean {data['mean_return']:.1f} / max {best:.1f} "
        f"(controller with epsilon {list(task.epsilons)})",
        f"  {'target':>9s} {'DT achieved (mean +- sd over seeds)':>38s}",
    ]
    for j, t in enumerate(targets):
        col = achieved[:, j]
        lines.append(f"  {t:9.1f} {col.mean():28.1f} +- {col.std():6.1f}")
    rho = np.array([spearman(np.array(targets), row) for row in achieved])
    mean_rho = f"{np.nanmean(rho):.3f}" if np.isfinite(rho).any() else "n/a: constant returns"
    dt_best = achieved[:, -1]
    # Normalised against the best return in the data (and, for negative returns, the worst).
    lo = float(data["min_return"])
    verdict = "DT >= BC" if dt_best.mean() >= bc_ret.mean() else "DT < BC"
    norm = (dt_best - lo) / (best - lo) if best > lo else np.full_like(dt_best, np.nan)
    lines += [
        f"  Spearman(target, achieved) per seed: {np.round(rho, 3).tolist()} (mean {mean_rho})",
        f"  DT at the best target: {dt_best.mean():.1f} +- {dt_best.std():.1f} = "
        f"{100 * dt_best.mean() / best:.1f}% of the best return in the data"
        if best > 0
        else f"  DT at the best target: {dt_best.mean():.1f} +- {dt_best.std():.1f}",
        f"    normalised (worst..best in data = 0..100): {100 * norm.mean():.1f}",
        f"  BC: {bc_ret.mean():.1f} +- {bc_ret.std():.1f}   -> DT - BC = "
        f"{dt_best.mean() - bc_ret.mean():+.1f} ({verdict})",
        f"  training: DT {np.mean([r['steps_per_s'] for r in dt]):.2f} steps/s, "
        f"BC {np.mean([r['steps_per_s'] for r in bc]):.2f} steps/s (incl. evaluation)",
    ]
    return lines


def main() -> None:
    """Parse options, run every task, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="gradient steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--envs", nargs="+", default=["cartpole", "pendulum"], choices=TASKS)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--eval-episodes", type=int, default=10, help="episodes per target")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = default")
    parser.add_argument("--quick", action="store_true", help="1 seed, 600 steps, CartPole")
    parser.add_argument("--progress", action="store_true", help="progress bars of the runs")
    parser.add_argument("--out", type=Path, default=None, help="keep datasets and runs here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds, args.envs, args.eval_episodes = 600, [1], ["cartpole"], 5
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        os.environ["MINARI_DATASETS_PATH"] = str(root / "minari")
        start = time.perf_counter()
        print(f"DT/BC learning: {args.steps} steps x seeds {args.seeds}, batch {args.batch}, "
              f"{args.eval_episodes} episodes per target", flush=True)  # fmt: skip
        results = [run_task(key, args, root) for key in args.envs]
        for result in results:
            print("\n".join(report(result)))
        print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
