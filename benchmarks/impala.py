r"""IMPALA vs PPO training throughput: wall-clock env steps/s of the whole trainer, in one run.

CartPole-v1 (Gymnasium, sync vector env), the mlp agent of configs/agent/mlp.yaml, the same
model and env settings in every row: rollouts of T=32 steps x 8 envs (algo.num_steps=32,
algo.segment_length=16; env.num_envs=8, and runtime.envs_per_actor=8 for the actor
processes), so every update trains on 256 env steps. Rows:

  * ppo               algo=ppo (its own defaults otherwise: 4 epochs x 8 minibatches)
  * A local           algo=A runtime=local (1 actor stepped in the learner process)
  * A process xK      algo=A runtime=process runtime.num_actors=K (K actor processes,
                      batch_rollouts=1: each update takes one rollout from whichever actor)
  * A ray xK          algo=A runtime=ray runtime.num_actors=K (--ray K: Ray actors on a
                      local Ray instance the run starts; its ~4 s start-up is not timed)

for each A of ``--algos``: impala (the defaults: 4 passes x 2 minibatches per rollout, so 8
gradient steps per 256 env steps, PPO's 32 per 1,024) and impala_paper (one step per rollout).
"x local" divides by the same algo's local row.

Each row is a real training run (``python -m rltrans.train`` in a subprocess, TensorBoard on,
one checkpoint at the end) of ``--warmup`` + ``--steps`` env steps. Timed part: the updates
after the warm-up, from the trainer's own ``charts/SPS`` (cumulative steps / wall time since
the loop started, logged every update): elapsed(s) = s / SPS(s), so the timed SPS is
(s_end - s_warm) / (elapsed(s_end) - elapsed(s_warm)). This is WALL time (the actors run in
other processes), and it excludes the actor processes' start-up (spawned: imports of torch
and rltrans; the learner's first update waits for it, ~20 s with 4 actors on 2 cores; the
warm-up is at least that first update). The split is the mean per
timed update of the trainer's perf/env_ms and perf/act_ms (runtime=process: summed over the
actors, so with K actors it can exceed the update's wall time), perf/learn_ms and
perf/queue_wait_ms (the learner waiting for a rollout; runtime=process only), and the mean
perf/policy_lag. Rows run one after the other in each round, in reversed order every other
round; with ``--rounds`` > 1 the table shows the median per row.

On a machine with C cores, K actors plus the learner compete for them: more actors than
C - 1 cannot add throughput.

    python benchmarks/impala.py [--steps 30720] [--warmup 2560] [--algos impala impala_paper]
                                [--actors 1 2 4] [--ray 2] [--threads 1] [--rounds 1]

Learning (steps and wall time to the threshold, per seed) runs through the learning
benchmark's grid with IMPALA:

    python benchmarks/learning.py --algo impala --runtime process --tasks cartpole tmaze30 \
        --agents mlp gtrxl --steps 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from common import timed, train

STEPS_PER_UPDATE = 32 * 8
COMMON = [
    "agent=mlp",
    "env=gym",
    "env.id=CartPole-v1",
    "env.num_envs=8",
    "algo.num_steps=32",
    "algo.segment_length=16",
    "progress=false",
    "tensorboard=true",
    "checkpoint_every=1000000",
    "seed=1",
]
SPLIT = ("env_ms", "act_ms", "learn_ms", "queue_wait_ms")


def rows(algos: list[str], actors: list[int], ray_actors: list[int]) -> list[tuple[str, list[str]]]:
    """(row name, overrides): PPO, then per algo its local, process and Ray rows."""
    out = [("ppo", ["algo=ppo"])]
    for algo in algos:
        out.append((f"{algo} local", [f"algo={algo}", "runtime=local"]))
        for runtime, counts in (("process", actors), ("ray", ray_actors)):
            for k in counts:
                args = [f"runtime={runtime}", f"runtime.num_actors={k}", "runtime.envs_per_actor=8"]
                out.append((f"{algo} {runtime} x{k}", [f"algo={algo}", *args]))
    return out


def measure(run: Path, warmup: int) -> dict[str, float]:
    """Timed SPS after ``warmup`` steps, the mean split per update and the mean policy lag."""
    out = timed(run, warmup, (*SPLIT, "policy_lag"))
    out["lag"] = out.pop("policy_lag")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30720, help="timed env steps per row")
    parser.add_argument("--warmup", type=int, default=2560, help="env steps before timing")
    parser.add_argument("--algos", nargs="+", default=["impala", "impala_paper"])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--ray", type=int, nargs="*", default=[], help="Ray actor counts (needs the ray extra)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all rows")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    a = parser.parse_args()
    round_up = lambda n: -(-n // STEPS_PER_UPDATE) * STEPS_PER_UPDATE  # noqa: E731
    warmup, steps = round_up(max(a.warmup, 1)), round_up(a.steps)  # >= the first update
    table = rows(a.algos, a.actors, a.ray)
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in table}
    print(
        f"CartPole-v1, mlp, T=32 x 8 envs = {STEPS_PER_UPDATE} steps/update, warm-up {warmup}"
        f" + timed {steps} env steps, torch_threads={a.threads}, {os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rltrans-bench-impala-") as tmp:
        for r in range(a.rounds):
            order = table if r % 2 == 0 else table[::-1]
            for name, extra in order:
                run = Path(tmp) / f"{name.replace(' ', '_')}-{r}"
                args = [*COMMON, *extra, f"total_steps={warmup + steps}"]
                args += [f"torch_threads={a.threads}", f"run_dir={run}"]
                summary = train(args, a.threads, a.timeout)
                row = measure(run, warmup)
                row["summary_sps"] = summary["SPS"]
                results[name].append(row)
                print(
                    f"  round {r} {name}: {row['sps']:.0f} SPS timed ({row['updates']} updates),"
                    f" {summary['SPS']:.0f} SPS whole run incl. start-up",
                    flush=True,
                )

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in results[name])

    ppo = med("ppo", "sps")
    head = (
        f"{'row':<26} {'SPS':>7} {'x local':>8} {'x ppo':>6} {'env ms':>7} {'act ms':>7}"
        f" {'learn ms':>8} {'wait ms':>8} {'lag':>5} {'whole-run SPS':>13}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for name, _ in table:
        sps = med(name, "sps")
        local = sps if name == "ppo" else med(f"{name.split()[0]} local", "sps")
        split = " ".join(
            f"{med(name, k):>{w}.1f}" for k, w in zip(SPLIT, (7, 7, 8, 8), strict=True)
        )
        print(
            f"{name:<26} {sps:>7.0f} {sps / local:>8.2f} {sps / ppo:>6.2f} {split}"
            f" {med(name, 'lag'):>5.2f} {med(name, 'summary_sps'):>13.0f}"
        )
    print(
        "\nSPS: wall-clock env steps/s after the warm-up (from charts/SPS); splits: mean ms per"
        " update (env/act summed over actor processes); wait = learner waiting for a rollout;"
        " lag = mean policy lag of the trained rollouts; whole-run SPS: the JSON summary's"
        " (includes actor start-up)."
    )


if __name__ == "__main__":
    main()
