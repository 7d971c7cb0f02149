r"""PPO on MuJoCo (Gymnasium's Hopper-v5 and HalfCheetah-v5), run the way a user runs it, against
CleanRL's published scores and against CleanRL's own script's speed.

Every run is ``python -m rltrans.train env=gym env.id=<Env>-v5 env.num_envs=1
agent=mlp_continuous seed=<s> total_steps=1000000`` (``--agents gtrxl``: ``agent=gtrxl`` at its
defaults, 8 envs), then ``python -m rltrans.evaluate`` over 10 deterministic episodes of its
last checkpoint, both in one process per run. A finished run is not done again and an
interrupted one resumes from its checkpoint, so the suite can be stopped and started at will.

CleanRL's figures (docs.cleanrl.dev, ppo_continuous_action.py, the v4 envs at 1M steps, mean
and std over 3 seeds of the last episodes' training returns): Hopper 2,383 +- 272,
HalfCheetah 1,443 +- 46. Ours are deterministic evaluations of the final policy.

Written to ``--out``: ``table.md`` (per env and agent, over every finished run in ``--out``:
the evaluated score's mean and std over the seeds, each seed, how many seeds reach CleanRL's
mean, the training return CleanRL reports (the last logged mean of the sampled training
episodes), SPS) and ``results.json``.

    python benchmarks/mujoco_ppo.py --out runs/mujoco              # 2 envs x 3 seeds, ~1 h each
    python benchmarks/mujoco_ppo.py --out runs/mujoco --agents gtrxl --seeds 1

``--speed CLEANRL_SCRIPT`` runs no grid: it alternates short runs of rltrans and of CleanRL's
``ppo_continuous_action.py`` (run unmodified by ``--cleanrl-python``, in a venv of its own
pins: gymnasium 0.29.1 has only the v4 envs, whose MuJoCo models the v5 ones share) at the
same settings, one thread each, over ``--rounds`` rounds (``--compile``: rltrans's
``compile=``), and writes each run's SPS over the whole run and over its second half (past a
compile and warm-up), the ratios per round and their medians to ``speed.md``.

    python benchmarks/mujoco_ppo.py --out runs/mujoco-speed \
        --speed cleanrl/ppo_continuous_action.py \
        --cleanrl-python cleanrl-venv/bin/python --speed-steps 61440 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from common import logged_sps, run_grid, train_and_evaluate

ENVS = ("Hopper-v5", "HalfCheetah-v5")
# CleanRL's published PPO (ppo_continuous_action.py, v4 envs, 1M steps): mean, std over 3 seeds.
CLEANRL = {"Hopper-v5": (2383.0, 272.0), "HalfCheetah-v5": (1443.0, 46.0)}
AGENTS = {
    "mlp_continuous": ["agent=mlp_continuous", "env.num_envs=1"],
    "gtrxl": ["agent=gtrxl"],  # its defaults, env=gym's 8 envs
}
EVAL_EPISODES = 10


@dataclass
class Result:
    env: str
    agent: str
    seed: int
    score: float  # mean return of the deterministic evaluation
    sps: float
    run_dir: str


def one_run(env_id: str, agent: str, seed: int, args: argparse.Namespace) -> Result:
    """Train (or resume, or reuse) one run and evaluate its last checkpoint."""
    run = Path(args.out) / f"{env_id}-{agent}-s{seed}"
    done = run / "result.json"
    if done.is_file():
        return Result(**json.loads(done.read_text()))
    steps = args.steps
    train = [
        "env=gym",
        f"env.id={env_id}",
        *AGENTS[agent],
        f"seed={seed}",
        f"total_steps={steps}",
        f"run_dir={run}",
        "progress=false",
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true", f"run_dir={run}", f"total_steps={steps}", "progress=false"]
    evaluate = [f"checkpoint={run}", f"episodes={EVAL_EPISODES}", "progress=false"]
    trained, scored = train_and_evaluate(run, train, evaluate)
    sps = float(trained.get("SPS") or 0.0) or logged_sps(run)
    result = Result(env_id, agent, seed, float(scored["mean_return"]), sps, str(run))
    done.write_text(json.dumps(asdict(result)))
    return result


def training_return(run: str) -> float:
    """The last logged mean return of the sampled training episodes (what CleanRL reports)."""
    from rltrans.plot import read_curve

    return float(read_curve(Path(run), "charts/episodic_return", "step").y[-1])


def table(results: list[Result]) -> str:
    """Markdown: per env and agent, the seeds' mean and std, each seed, k of n at CleanRL's mean."""
    lines = [
        "| env | agent | evaluated (mean +- std) | seeds | at CleanRL's mean | training return "
        "| CleanRL (v4, training) | SPS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env_id in ENVS:
        for agent in AGENTS:
            rows = sorted(
                (r for r in results if (r.env, r.agent) == (env_id, agent)), key=lambda r: r.seed
            )
            if not rows:
                continue
            scores = [r.score for r in rows]
            std = statistics.stdev(scores) if len(scores) > 1 else 0.0
            ref, ref_std = CLEANRL[env_id]
            at = sum(s >= ref for s in scores)
            seeds = ", ".join(f"{s:.0f}" for s in scores)
            sps = statistics.median(r.sps for r in rows)
            trained = statistics.fmean(training_return(r.run_dir) for r in rows)
            lines.append(
                f"| {env_id} | {agent} | {statistics.fmean(scores):.0f} +- {std:.0f} | {seeds} "
                f"| {at} of {len(rows)} | {trained:.0f} | {ref:.0f} +- {ref_std:.0f} | {sps:.0f} |"
            )
    return "\n".join(lines) + "\n"


def grid(args: argparse.Namespace) -> None:
    """Train and evaluate every (env, agent, seed); write the table."""
    runs = {
        f"{env_id}-{agent}-s{seed}": (lambda e=env_id, a=agent, s=seed: one_run(e, a, s, args))
        for agent in args.agents
        for seed in range(1, args.seeds + 1)
        for env_id in args.envs
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_grid(args.jobs, runs, lambda r: f"score {r.score:.0f}, {r.sps:.0f} SPS")
    # Every finished run in --out (other agents' too), so one table holds the whole suite.
    results = [Result(**json.loads(p.read_text())) for p in sorted(out.glob("*/result.json"))]
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    (out / "table.md").write_text(table(results))
    print(table(results))


@dataclass
class Speed:
    """One run's speed: over the whole run, and over its second half (compiled, warmed up)."""

    whole: float
    steady: float


def steady_rate(steps: list[float], rates: list[float]) -> Speed:
    """Speed from cumulative rates ``rates[i] = steps[i] / seconds[i]`` logged at ``steps[i]``
    (both scripts log that way): the last one, and the rate between the first log at or past
    half the steps and the last log, so a compile or warm-up at the start is left out."""
    seconds = [step / rate for step, rate in zip(steps, rates, strict=True)]
    half = next(i for i, step in enumerate(steps) if step >= steps[-1] / 2)
    if half == len(steps) - 1:
        raise ValueError(f"{len(steps)} logged rates: too few for a second half (run longer)")
    steady = (steps[-1] - steps[half]) / (seconds[-1] - seconds[half])
    return Speed(whole=rates[-1], steady=steady)


def _rltrans_sps(env_id: str, steps: int, out: Path, round_: int, compile_: str) -> Speed:
    from rltrans.plot import read_curve

    run = out / f"rltrans-{env_id}-r{round_}"
    argv = [
        sys.executable,
        "-m",
        "rltrans.train",
        "env=gym",
        f"env.id={env_id}",
        "env.num_envs=1",
        "agent=mlp_continuous",
        f"total_steps={steps}",
        f"run_dir={run}",
        f"compile={compile_}",
        "overwrite=true",
        "progress=false",
        "torch_threads=1",  # TensorBoard on: CleanRL's script writes its events too
    ]
    subprocess.run(argv, capture_output=True, text=True, check=True, env=_one_thread())
    curve = read_curve(run, "charts/SPS", "step")
    return steady_rate(list(curve.x), list(curve.y))


def _cleanrl_sps(script: str, python: str, env_id: str, steps: int, out: Path) -> Speed:
    v4 = env_id.replace("-v5", "-v4")  # gymnasium 0.29.1 (CleanRL's pin) has only v4
    argv = [python, script, "--env-id", v4, "--total-timesteps", str(steps), "--no-cuda"]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=True, cwd=out, env=_one_thread()
    )
    rates = [float(r) for r in re.findall(r"^SPS: (\d+)", done.stdout, re.M)]
    # One line per update of its default 2,048 steps (one env): the update's last step.
    return steady_rate([2048.0 * (i + 1) for i in range(len(rates))], rates)


def _one_thread() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def speed(args: argparse.Namespace) -> None:
    """Alternate rltrans and CleanRL runs of ``--speed-steps``; SPS and ratios per round, and
    their medians, over the whole run and over its second half."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"rltrans at compile={args.compile}; {args.speed_steps:,} steps a run, one thread each",
        "",
        "| env | round | rltrans SPS (whole / 2nd half) | CleanRL SPS (whole / 2nd half) "
        "| ratio, whole | ratio, 2nd half |",
        "|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[tuple[float, float]]] = {}
    for env_id in args.envs:
        for r in range(1, args.rounds + 1):
            ours = _rltrans_sps(env_id, args.speed_steps, out, r, args.compile)
            theirs = _cleanrl_sps(args.speed, args.cleanrl_python, env_id, args.speed_steps, out)
            whole, steady = ours.whole / theirs.whole, ours.steady / theirs.steady
            ratios.setdefault(env_id, []).append((whole, steady))
            lines.append(
                f"| {env_id} | {r} | {ours.whole:.0f} / {ours.steady:.0f} "
                f"| {theirs.whole:.0f} / {theirs.steady:.0f} | {whole:.2f}x | {steady:.2f}x |"
            )
            print(lines[-1], flush=True)
    for env_id, values in ratios.items():
        whole = statistics.median(v[0] for v in values)
        steady = statistics.median(v[1] for v in values)
        lines.append(f"| {env_id} | median | | | {whole:.2f}x | {steady:.2f}x |")
    (out / "speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Parse the options; run the grid or the speed comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder of the runs and the table")
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=ENVS)
    parser.add_argument("--agents", nargs="+", default=["mlp_continuous"], choices=list(AGENTS))
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N per env and agent")
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one core each)")
    parser.add_argument("--speed", metavar="CLEANRL_SCRIPT", help="compare speed, no grid")
    parser.add_argument("--cleanrl-python", default=sys.executable, help="python for CleanRL")
    parser.add_argument("--speed-steps", type=int, default=61_440, help="env steps per speed run")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds per env")
    parser.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "true", "false"],
        help="rltrans's compile= in the speed runs (auto: a user's default)",
    )
    args = parser.parse_args()
    speed(args) if args.speed else grid(args)


if __name__ == "__main__":
    main()
