r"""D4RL-style MuJoCo datasets made here with rltrans's own PPO, and the Decision Transformer
against behaviour cloning on them.

``datasets`` makes, per env, D4RL's four datasets as Minari datasets (Minari's own writer),
with D4RL's reference returns as ``ref_min_score`` / ``ref_max_score``:

1. the behaviour policy: ``python -m rltrans.train agent=mlp_continuous env=gym
   env.id=<Env>-v5 env.num_envs=1 seed=<--behaviour-seed> total_steps=1000000``, a
   checkpoint every 10,240 steps, every training episode recorded
   (:class:`rltrans.envs.recorder.EpisodeRecorder`), in ``<out>/<Env>/seed<k>``;
2. its checkpoints evaluated (10 episodes, actions sampled as when collecting) in order
   until one reaches a third of the final policy's return: the *medium* policy;
3. ``expert``: episodes of the final policy, ``medium``: of the medium policy, each
   ``python -m rltrans.collect ... deterministic=false`` until about 1M steps;
   ``medium-replay``: every training episode recorded until the medium checkpoint's step;
   ``medium-expert``: medium and expert together.

Ids: ``rltrans/<env>/<kind>-v0`` (``rltrans/hopper/medium-replay-v0``), in
``$MINARI_DATASETS_PATH``. Each step is skipped when its output exists, and the behaviour run
resumes from its checkpoint, so the command can be stopped and started at will.

``grid`` trains DT (the paper's Gym settings, returns-to-go / 1,000), BC and filtered BC
(``algo.top_fraction=0.1``) for ``--train-steps`` gradient steps per seed, evaluated at the
end (DT at five targets up to the paper's and five up to its data's best); ``table`` writes
``table.md`` with the D4RL-normalised scores and the issue's pass rules as k of n.

    python benchmarks/offline_mujoco.py datasets --envs Hopper-v5 --out runs/offline-mujoco
    python benchmarks/offline_mujoco.py grid --envs Hopper-v5 --kinds medium medium-replay \
        --seeds 1 2 3 --train-steps 10000 --out runs/offline-mujoco
    python benchmarks/offline_mujoco.py table --out runs/offline-mujoco
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import logged_sps, run_grid, run_python

# D4RL's reference returns (random, expert; d4rl/infos.py) and the DT paper's target return.
ENVS: dict[str, dict[str, Any]] = {
    "Hopper-v5": {"name": "hopper", "ref": (-20.27, 3234.3), "target": 3600.0},
    "HalfCheetah-v5": {"name": "halfcheetah", "ref": (-280.18, 12135.0), "target": 6000.0},
}
KINDS = ("expert", "medium", "medium-replay", "medium-expert")
BEHAVIOUR_STEPS = 1_000_000
DATASET_STEPS = 1_000_000  # expert and medium, as D4RL's
CHECKPOINT_EVERY = 5  # updates of 2,048 steps
PROBE_EPISODES = 10
AGENTS = {  # the DT paper's Gym settings are agent=dt's and algo=offline's defaults
    # max_timestep: the paper's (the env's step limit), not only the data's longest episode
    "dt": ["agent=dt", "algo.return_scale=1000", "agent.max_timestep=1000"],
    "bc": ["agent=bc"],
    "bc10": ["agent=bc", "algo.top_fraction=0.1"],
}
EVAL_EPISODES = 10
RUNNER = (
    "import json, sys\n"
    "from rltrans import evaluate\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    if evaluate.main(argv):\n"
    "        sys.exit(1)\n"
)


def dataset_id(env_id: str, kind: str) -> str:
    """Our Minari id of one D4RL-style dataset."""
    return f"rltrans/{ENVS[env_id]['name']}/{kind}-v0"


def behaviour(env_id: str, folder: Path, seed: int) -> dict:
    """Train (or resume, or reuse) the behaviour policy, recording its training episodes."""
    done = folder / "behaviour.json"
    if done.is_file():
        return json.loads(done.read_text())
    run = folder / "behaviour"
    recorder = (
        "{path: rltrans.envs.recorder.EpisodeRecorder, "
        f"kwargs: {{folder: {folder / 'replay'}}}, phase: training}}"
    )
    train = [
        "agent=mlp_continuous",
        "env=gym",
        f"env.id={env_id}",
        "env.num_envs=1",
        f"seed={seed}",
        f"total_steps={BEHAVIOUR_STEPS}",
        f"checkpoint_every={CHECKPOINT_EVERY}",
        "keep_checkpoints=1000",
        # compile=auto decides by timing, so the machine's load would pick the numerics.
        "compile=true",
        f"env.wrappers=[{recorder}]",
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true", f"total_steps={BEHAVIOUR_STEPS}"]
    common = [f"run_dir={run}", "trust_env_code=true", "torch_threads=1", "progress=false"]
    start = time.perf_counter()
    (summary,) = run_python(["-m", "rltrans.train", *train, *common], f"{env_id} behaviour")
    summary["wall_s"] = time.perf_counter() - start
    done.write_text(json.dumps(summary))
    return summary


def probe(checkpoints: list[Path], env_id: str) -> list[dict]:
    """Evaluate checkpoints as they will collect (actions sampled), 10 episodes each."""
    argvs = [
        [
            f"checkpoint={c}",
            f"env_id={env_id}",
            f"episodes={PROBE_EPISODES}",
            "num_envs=10",
            "deterministic=false",
            "trust_env_code=true",  # the behaviour run's recorder (never built to evaluate)
            "torch_threads=1",
            "progress=false",
        ]
        for c in checkpoints
    ]
    return run_python(["-c", RUNNER, json.dumps(argvs)], f"{env_id} probes")


def medium_policy(env_id: str, folder: Path) -> dict:
    """The final policy's return and the first checkpoint at a third of it (cached)."""
    done = folder / "policies.json"
    if done.is_file():
        return json.loads(done.read_text())
    ckpts = folder / "behaviour" / "checkpoints"
    steps = sorted(ckpts.glob("step_*.pt"))
    (expert,) = probe([ckpts / "last.pt"], env_id)
    level = expert["mean_return"] / 3
    chosen, probes = None, []
    for first in range(0, len(steps), 8):  # in order, a few per process
        batch = steps[first : first + 8]
        for path, result in zip(batch, probe(batch, env_id), strict=True):
            probes.append({"checkpoint": str(path), **_brief(result)})
            if chosen is None and result["mean_return"] >= level:
                chosen = probes[-1]
        if chosen is not None:
            break
    if chosen is None:
        raise RuntimeError(f"{env_id}: no checkpoint reaches a third of {expert['mean_return']}")
    policies = {"expert": {"checkpoint": str(ckpts / "last.pt"), **_brief(expert)}}
    policies["medium"] = chosen
    policies["medium_step"] = int(Path(chosen["checkpoint"]).stem.split("_")[1])
    policies["probes"] = probes
    done.write_text(json.dumps(policies, indent=1))
    return policies


def _brief(result: dict) -> dict:
    return {k: result[k] for k in ("mean_return", "std_return", "mean_length")}


def collect(env_id: str, kind: str, policy: dict, seed: int) -> dict:
    """``python -m rltrans.collect`` of about DATASET_STEPS steps of one policy."""
    episodes = math.ceil(DATASET_STEPS / max(1.0, policy["mean_length"]))
    low, high = ENVS[env_id]["ref"]
    args = [
        f"dataset_id={dataset_id(env_id, kind)}",
        f"policy={policy['checkpoint']}",
        f"env_id={env_id}",
        f"episodes={episodes}",
        "deterministic=false",
        f"seed={seed}",
        f"ref_min_score={low}",
        f"ref_max_score={high}",
        "torch_threads=1",
        "progress=false",
        "overwrite=true",
        # Quoted: the override grammar reads a bare colon or parenthesis as its own.
        f'description="{kind} dataset of {env_id} in the D4RL recipe, made by '
        f"benchmarks/offline_mujoco.py: {episodes} episodes of rltrans PPO policy "
        f'{policy["checkpoint"]}, actions sampled"',
    ]
    start = time.perf_counter()
    (summary,) = run_python(["-m", "rltrans.collect", *args], f"{dataset_id(env_id, kind)}")
    summary["wall_s"] = time.perf_counter() - start
    return summary


def write(env_id: str, kind: str, episodes: list, description: str) -> dict:
    """Write episodes made here (not by rltrans.collect) with the env's reference scores."""
    import numpy as np

    from rltrans.envs.minari_data import write_minari

    low, high = ENVS[env_id]["ref"]
    path = write_minari(
        dataset_id(env_id, kind),
        episodes,
        env=env_id,
        algorithm_name="rltrans PPO (agent=mlp_continuous)",
        author="rltrans",
        description=description,
        overwrite=True,
        ref_min_score=low,
        ref_max_score=high,
    )
    returns = np.array([ep.episode_return for ep in episodes])
    return {
        "dataset_id": dataset_id(env_id, kind),
        "path": str(path),
        "episodes": len(episodes),
        "steps": int(sum(len(ep) for ep in episodes)),
        "mean_return": float(returns.mean()),
        "min_return": float(returns.min()),
        "max_return": float(returns.max()),
    }


def replay(env_id: str, folder: Path, until: int) -> dict:
    """``medium-replay``: the recorded training episodes that ended by step ``until``."""
    from rltrans.envs.recorder import read_recorded

    kept, steps = [], 0
    for ep in read_recorded(folder / "replay"):
        if steps + len(ep) > until:
            break
        kept.append(ep)
        steps += len(ep)
    text = (
        f"medium-replay dataset of {env_id} in D4RL's recipe, made by "
        f"benchmarks/offline_mujoco.py: the {len(kept)} episodes rltrans PPO's training played "
        f"in its first {until} steps, until its policy reached the medium level"
    )
    return write(env_id, "medium-replay", kept, text)


def combined(env_id: str) -> dict:
    """``medium-expert``: the medium and expert datasets' episodes together."""
    from rltrans.envs.minari_data import load_minari

    episodes = []
    for kind in ("medium", "expert"):
        episodes += load_minari(dataset_id(env_id, kind), progress=False).episodes
    text = f"medium-expert dataset of {env_id}: rltrans/{ENVS[env_id]['name']}'s medium and expert"
    return write(env_id, "medium-expert", episodes, text)


def make(env_id: str, kind: str, folder: Path, policies: dict) -> dict:
    """One dataset of one env, from its policies (and, for medium-replay, the recording)."""
    if kind in ("expert", "medium"):
        return collect(env_id, kind, policies[kind], seed=KINDS.index(kind) + 1)
    if kind == "medium-replay":
        return replay(env_id, folder, policies["medium_step"])
    return combined(env_id)


def datasets(args: argparse.Namespace) -> None:
    """Behaviour policy, medium policy and the four datasets per env; datasets.json."""
    for env_id in args.envs:
        folder = Path(args.out) / env_id / f"seed{args.behaviour_seed}"
        folder.mkdir(parents=True, exist_ok=True)
        record = folder / "datasets.json"
        made = json.loads(record.read_text()) if record.is_file() else {}
        made["behaviour"] = behaviour(env_id, folder, args.behaviour_seed)
        print(f"{env_id}: behaviour policy {made['behaviour']['wall_s']:.0f} s", flush=True)
        policies = medium_policy(env_id, folder)
        made["policies"] = {k: v for k, v in policies.items() if k != "probes"}
        for kind in KINDS:
            if kind not in made:
                start = time.perf_counter()
                made[kind] = make(env_id, kind, folder, policies)
                made[kind]["wall_s"] = time.perf_counter() - start
                record.write_text(json.dumps(made, indent=1))
            info = made[kind]
            print(
                f"{dataset_id(env_id, kind)}: {info['episodes']} episodes, {info['steps']} "
                f"steps, return {info['mean_return']:.0f} ({info['wall_s']:.0f} s)",
                flush=True,
            )


@dataclass
class Result:
    env: str
    kind: str
    agent: str
    seed: int
    return_by_target: dict[str, float]
    normalized: float  # D4RL score at the paper's target
    steps_per_s: float
    run_dir: str
    data_best: float | None = None  # the data's best return (DT's second set of targets)


def targets(env_id: str, agent: str, best: float) -> list[float]:
    """DT: five targets evenly up to the paper's, and five up to the data's best return
    (DT follows its target only within the returns its data hold); BC: the paper's (BC
    ignores it)."""
    top = ENVS[env_id]["target"]
    if agent != "dt":
        return [top]
    return [round(v * k / 5) for v in (top, best) for k in range(1, 6)]


def data_best(env_id: str, kind: str) -> float:
    """The best episode return in one of our datasets."""
    from rltrans.envs.minari_data import load_minari

    return float(load_minari(dataset_id(env_id, kind), progress=False).returns().max())


def one_run(env_id: str, kind: str, agent: str, seed: int, args: argparse.Namespace) -> Result:
    """Train (or resume, or reuse) one offline run; its final evaluation is the result."""
    run = Path(args.out) / env_id / "runs" / f"{kind}-{agent}-s{seed}"
    done = run / "result.json"
    if done.is_file():
        return Result(**json.loads(done.read_text()))
    best = data_best(env_id, kind)
    goals = ",".join(f"{t:g}" for t in targets(env_id, agent, best))
    train = [
        *AGENTS[agent],
        f"dataset={dataset_id(env_id, kind)}",
        f"seed={seed}",
        f"train_steps={args.train_steps}",
        f"algo.eval_targets=[{goals}]",
        f"algo.eval_episodes={EVAL_EPISODES}",
        "algo.eval_every=0",
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true", f"train_steps={args.train_steps}"]
    common = [f"run_dir={run}", "torch_threads=1", "progress=false"]
    (summary,) = run_python(["-m", "rltrans.train", *train, *common], run.name)
    by_target = summary["return_by_target"]
    top = f"{ENVS[env_id]['target']:g}"
    # A run that had finished before this call trains nothing now: its logged speed.
    speed = float(summary["steps_per_s"]) or logged_sps(run)
    result = Result(
        env_id,
        kind,
        agent,
        seed,
        by_target,
        float(summary["normalized_score_by_target"][top]),
        speed,
        str(run),
        best,
    )
    done.write_text(json.dumps(asdict(result)))
    return result


def grid(args: argparse.Namespace) -> None:
    """Every (env, dataset, agent, seed) run; then the table."""
    runs = {
        f"{env_id}-{kind}-{agent}-s{seed}": (
            lambda e=env_id, k=kind, a=agent, s=seed: one_run(e, k, a, s, args)
        )
        for seed in args.seeds
        for env_id in args.envs
        for kind in args.kinds
        for agent in args.agents
    }
    run_grid(args.jobs, runs, lambda r: f"normalised {r.normalized:.1f}")
    write_table(args)


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (0 when either is constant)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    spread = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / spread if spread else 0.0


def _rank_cell(results: list[Result], which: str) -> str:
    """Spearman(target, return) >= 0.8 as k of n over one set of DT's targets: ``paper``
    (evenly up to the paper's target) or ``data`` (evenly up to the data's best return)."""
    rho = []
    for r in results:
        top = ENVS[r.env]["target"] if which == "paper" else r.data_best
        if top is None:
            continue
        goals = [round(top * k / 5) for k in range(1, 6)]
        got = {round(float(t)): v for t, v in r.return_by_target.items()}
        rho.append(spearman(goals, [got[g] for g in goals]))
    if not rho:
        return "-"
    return f"{sum(p >= 0.8 for p in rho)} of {len(rho)} ({', '.join(f'{p:.2f}' for p in rho)})"


def _at_best(results: list[Result]) -> str:
    """DT's normalised score at the data's best return, per seed."""
    scores = []
    for r in results:
        if r.data_best is not None:
            low, high = ENVS[r.env]["ref"]
            got = {round(float(t)): v for t, v in r.return_by_target.items()}
            scores.append(100 * (got[round(r.data_best)] - low) / (high - low))
    return _cell(scores)


def write_table(args: argparse.Namespace) -> None:
    """table.md and results.json over every finished run in --out."""
    out = Path(args.out)
    found = sorted(out.glob("*/runs/*/result.json"))
    results = [Result(**json.loads(p.read_text())) for p in found]
    lines = [
        "| env | dataset | DT | BC | 10% BC | DT >= BC | DT >= BC + 20 | Spearman >= 0.8, "
        "paper's targets | Spearman >= 0.8, up to the data's best | DT at the data's best "
        "| DT grad steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in ENVS:
        for kind in KINDS:
            by = {
                a: {r.seed: r for r in results if (r.env, r.kind, r.agent) == (env_id, kind, a)}
                for a in AGENTS
            }
            if not any(by.values()):
                continue
            cells = [_cell([r.normalized for _, r in sorted(by[a].items())]) for a in AGENTS]
            seeds = sorted(set(by["dt"]) & set(by["bc"]))
            margin = sum(by["dt"][s].normalized >= by["bc"][s].normalized for s in seeds)
            margin20 = sum(by["dt"][s].normalized >= by["bc"][s].normalized + 20 for s in seeds)
            dts = [r for _, r in sorted(by["dt"].items())]
            speed = statistics.median(r.steps_per_s for r in dts) if dts else 0
            lines.append(
                f"| {env_id} | {kind} | {' | '.join(cells)} | {margin} of {len(seeds)} "
                f"| {margin20} of {len(seeds)} | {_rank_cell(dts, 'paper')} "
                f"| {_rank_cell(dts, 'data')} | {_at_best(dts)} | {speed:.1f} |"
            )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print("\n".join(lines))


def _cell(scores: list[float]) -> str:
    if not scores:
        return "-"
    mean = statistics.fmean(scores)
    return f"{mean:.1f} ({', '.join(f'{s:.1f}' for s in scores)})"


def main() -> None:
    """Parse the stage and its options; run it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("datasets", "grid", "table"))
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5"], choices=list(ENVS))
    parser.add_argument("--kinds", nargs="+", default=["medium", "medium-replay"], choices=KINDS)
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=list(AGENTS))
    parser.add_argument("--behaviour-seed", type=int, default=1, help="the PPO run's seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--train-steps", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default="runs/offline-mujoco")
    args = parser.parse_args()
    {"datasets": datasets, "grid": grid, "table": write_table}[args.stage](args)


if __name__ == "__main__":
    main()
