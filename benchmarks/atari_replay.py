r"""DQN Replay on real Atari frames, end to end: a PPO policy trained here on an ALE game, its
rollouts written as DQN Replay checkpoints in the d4rl-atari layout, and the Atari Decision
Transformer against behaviour cloning on them, evaluated in ALE.

Stages (each skips what is on disk; the training runs resume from their checkpoints):

1. ``policy``: ``python -m rltrans.train env=atari env.id=ALE/<Game>-v5 agent=mlp`` with
   CleanRL's ``ppo_atari.py`` settings (8 envs, 128 steps, 4 epochs of 4 minibatches, lr
   2.5e-4 annealed, clip 0.1) for ``--policy-steps`` agent steps;
2. ``data``: its sampled actions, each replaced by a uniformly random one with probability
   epsilon, one epsilon per env from ``--epsilons`` (a mixed-quality dataset, as DQN Replay's
   ``mixed`` checkpoints mix a learning agent's epsilon-greedy play), in the real game (no
   life loss as terminal, the game's rewards), until ``--rows`` rows; written by
   :func:`rltrans.envs.dqn_replay.dopamine_rows` as Dopamine logs them (3 zero rows before
   each episode, rewards clipped to [-1, 1]) into DQN run 1, checkpoint 1: the d4rl-atari id
   ``<game>-mixed-v0`` under ``<out>/dqn``;
3. ``grid``: ``agent=dt`` (the paper's Atari model: 6 layers, 8 heads, 128-dim; its CNN) and
   ``agent=bc`` on it, ``--seeds`` seeds of ``--train-steps`` gradient steps, with context
   ``--context`` and batch ``--batch`` (the paper: 30 and 128; smaller on a CPU, stated in
   the table), lr 6e-4 as the paper's Atari runs; evaluated in ALE without sticky actions
   (d4rl-atari's evaluation env), ``--eval-episodes`` episodes, DT conditioned on the data's
   best (clipped) return;
4. ``table``: ``table.md``: the data's mean and best game score, each seed's score, and the
   pass rule (DT above BC and above the data's mean, k of n).

    python benchmarks/atari_replay.py policy --out runs/atari-replay --policy-steps 1000000
    python benchmarks/atari_replay.py data --out runs/atari-replay --rows 200000
    python benchmarks/atari_replay.py grid --out runs/atari-replay --train-steps 5000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common import run_grid, run_python

PPO_ATARI = [  # CleanRL ppo_atari.py's settings on rltrans's Atari preprocessing
    "env=atari",
    "agent=mlp",
    "env.num_envs=8",
    "algo.num_steps=128",
    "algo.segment_length=1",
    "algo.epochs=4",
    "algo.num_minibatches=4",
    "algo.lr=2.5e-4",
    "algo.clip_coef=0.1",
    "algo.vf_clip_coef=0.1",
    "algo.ent_coef=0.01",
]
AGENTS = {
    "dt": ["agent=dt", "agent.layers=6", "agent.heads=8", "algo.lr=6e-4"],
    "bc": ["agent=bc", "algo.lr=6e-4"],
}


def policy(args: argparse.Namespace) -> dict:
    """Train (or resume, or reuse) the behaviour policy; its summary."""
    out = Path(args.out)
    done = out / "policy.json"
    if done.is_file():
        return json.loads(done.read_text())
    run = out / "policy"
    train = [*PPO_ATARI, f"env.id=ALE/{args.game}-v5", "seed=0"]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true"]
    common = [f"total_steps={args.policy_steps}", f"run_dir={run}", "progress=false"]
    start = time.perf_counter()
    (summary,) = run_python(["-m", "rltrans.train", *train, *common, "torch_threads=1"], "policy")
    summary["wall_s"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(summary))
    return summary


def rollouts(args: argparse.Namespace) -> tuple[list, list[float]]:
    """Episodes of the policy with per-env epsilon until ``--rows`` rows (the episodes under
    way then finish), and their game scores."""
    import numpy as np
    import torch

    from rltrans import load_policy
    from rltrans.envs.dqn_replay_files import PADDING_ROWS
    from rltrans.envs.gym_vec import make_vector_env

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    acting = load_policy(Path(args.out) / "policy", torch_threads=1)
    epsilons = np.array(args.epsilons * args.envs_per_epsilon, dtype=np.float64)
    n = len(epsilons)
    envs = make_vector_env(f"ALE/{args.game}-v5", n, seed=args.seed, training=False)
    obs, _ = envs.reset()
    state, starts = acting.initial_state(n), np.ones(n, dtype=bool)
    open_eps: list[list[list]] = [[[], [], []] for _ in range(n)]
    active = np.ones(n, dtype=bool)  # past --rows, envs finish their episode and stop
    episodes, scores, rows = [], [], 0
    try:
        while active.any():
            actions, state = acting.act(obs, state, starts, deterministic=False)
            random = rng.random(n) < epsilons
            actions = np.where(random, rng.integers(0, envs.single_action_space.n, n), actions)
            frames = obs[:, -1]  # the newest of each env's 4 stacked frames
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            starts = terminated | truncated
            for i in np.flatnonzero(active):
                step = (frames[i], actions[i], rewards[i])
                for part, value in zip(open_eps[i], step, strict=True):
                    part.append(value)
                if starts[i]:
                    episodes.append(tuple(np.stack(p) for p in open_eps[i]))
                    scores.append(float(np.sum(open_eps[i][2])))
                    rows += PADDING_ROWS + len(open_eps[i][0])
                    open_eps[i] = [[], [], []]
                    # No episode starts past the row budget: the ones under way finish, so
                    # long (good) episodes are not cut out in favour of short ones.
                    active[i] = rows < args.rows
    finally:
        envs.close()
    return episodes, scores


def data(args: argparse.Namespace) -> dict:
    """Write the policy's mixed-quality rollouts as DQN Replay checkpoint 1 of run 1."""
    from rltrans.envs.dqn_replay import dopamine_rows, write_dqn_replay_shard

    out = Path(args.out)
    done = out / "data.json"
    if done.is_file():
        return json.loads(done.read_text())
    start = time.perf_counter()
    episodes, scores = rollouts(args)
    rows = dopamine_rows(episodes)
    write_dqn_replay_shard(out / "dqn", args.game, 1, 1, *rows, layout="d4rl")
    clipped = [float(sum(min(max(r, -1.0), 1.0) for r in ep[2])) for ep in episodes]
    info = {
        "dataset": f"{args.game.lower()}-mixed-v0",
        "rows": len(rows[0]),
        "episodes": len(episodes),
        "epsilons": args.epsilons,
        "mean_score": statistics.fmean(scores),
        "best_score": max(scores),
        "mean_clipped_return": statistics.fmean(clipped),
        "best_clipped_return": max(clipped),
        "wall_s": time.perf_counter() - start,
    }
    done.write_text(json.dumps(info, indent=1))
    return info


@dataclass
class Result:
    agent: str
    seed: int
    score: float  # mean game score of the evaluation episodes
    steps_per_s: float
    run_dir: str
    context: int = 0  # the run's settings, which the table states (0: not recorded)
    batch: int = 0
    train_steps: int = 0


def one_run(agent: str, seed: int, args: argparse.Namespace, target: float) -> Result:
    """Train (or resume, or reuse) one offline run on the data; its final evaluation."""
    run = Path(args.out) / "runs" / f"{agent}-s{seed}"
    done = run / "result.json"
    if done.is_file():
        return Result(**json.loads(done.read_text()))
    train = [
        *AGENTS[agent],
        f"dataset={args.game.lower()}-mixed-v0",
        f"algo.dqn_replay.root={Path(args.out) / 'dqn'}",
        "algo.dqn_replay.check_size=false",
        f"agent.{'context' if agent == 'dt' else 'history'}={args.context}",
        f"algo.batch_size={args.batch}",
        f"seed={seed}",
        f"algo.eval_targets=[{target:g}]",
        f"algo.eval_episodes={args.eval_episodes}",
        "algo.eval_every=0",
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true"]
    common = [f"train_steps={args.train_steps}", f"run_dir={run}", "progress=false"]
    (summary,) = run_python(["-m", "rltrans.train", *train, *common, "torch_threads=1"], run.name)
    score = float(summary["eval_mean_return"])
    speed = float(summary["steps_per_s"])
    result = Result(agent, seed, score, speed, str(run), args.context, args.batch, args.train_steps)
    done.write_text(json.dumps(asdict(result)))
    return result


def grid(args: argparse.Namespace) -> None:
    """DT and BC, every seed, on the written data; then the table."""
    target = data(args)["best_clipped_return"]
    runs = {
        f"{agent}-s{seed}": (lambda a=agent, s=seed: one_run(a, s, args, target))
        for seed in args.seeds
        for agent in args.agents
    }
    run_grid(args.jobs, runs, lambda r: f"score {r.score:.1f}")
    table(args)


def settings(results: list[Result]) -> str:
    """The runs' context, batch and gradient steps, as the runs recorded them (each distinct
    value listed, so a table over mixed settings says so)."""

    def values(name: str) -> str:
        seen = sorted({getattr(r, name) for r in results})
        return "/".join(f"{v:,}" if v else "?" for v in seen) or "-"

    return (
        f"context {values('context')}, batch {values('batch')}, "
        f"{values('train_steps')} gradient steps"
    )


def table(args: argparse.Namespace) -> None:
    """table.md: the data's scores, each agent's per seed, DT above BC and the data's mean."""
    out = Path(args.out)
    info = json.loads((out / "data.json").read_text())
    results = [Result(**json.loads(p.read_text())) for p in sorted(out.glob("runs/*/result.json"))]
    by = {a: {r.seed: r for r in results if r.agent == a} for a in AGENTS}
    seeds = sorted(set(by["dt"]) & set(by["bc"]))
    wins = sum(
        by["dt"][s].score > by["bc"][s].score and by["dt"][s].score > info["mean_score"]
        for s in seeds
    )
    cells = {
        a: ", ".join(f"{r.score:.1f}" for _, r in sorted(by[a].items())) or "-" for a in AGENTS
    }
    lines = [
        f"{args.game}: {info['rows']:,} rows, {info['episodes']} episodes, epsilons "
        f"{info['epsilons']}; data mean score {info['mean_score']:.1f}, best "
        f"{info['best_score']:.0f}; {settings(results)}",
        "",
        "| DT (per seed) | BC (per seed) | DT > BC and > the data's mean | DT grad steps/s |",
        "|---|---|---|---|",
        f"| {cells['dt']} | {cells['bc']} | {wins} of {len(seeds)} | "
        f"{statistics.median(r.steps_per_s for r in by['dt'].values()) if by['dt'] else 0:.2f} |",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Parse the stage and its options; run it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("policy", "data", "grid", "table"))
    parser.add_argument("--game", default="Breakout")
    parser.add_argument("--policy-steps", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0])
    parser.add_argument("--envs-per-epsilon", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7, help="the data's env and epsilon seed")
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=list(AGENTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--train-steps", type=int, default=5000)
    parser.add_argument("--context", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default="runs/atari-replay")
    args = parser.parse_args()
    {"policy": policy, "data": data, "grid": grid, "table": table}[args.stage](args)


if __name__ == "__main__":
    main()
