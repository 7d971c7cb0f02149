"""PPO speed under one variation, as ratios to a reference measured in the same run.

Every variation measures its rows in one call, interleaved (whole runs in reversed order every
other round, or one update of every in-process setup in turn), and gives each row's ratio to
its reference as the median of the per-round ratios. ``--vary NAME --help`` lists its options.

  acting    ms per acting step: GTrXL with and without its key/value cache, compiled, against
            LSTMs of equal parameters and width (benchmarks/speed_inprocess.py)
  agent     PPO updates of trxl and gtrxl at a popular PPO-TrXL script's small config, eager
            and compiled: process CPU time, split env / act / learn; x trxl eager
  rollout   the device rollout against the generic acting loop by env count, eager, compiled,
            bfloat16; x the generic eager loop of the same agent and N
  defaults  whole runs on the vector config (T-maze 30, trxl 4 x 64): the defaults against
            torch_threads=1 compile=false, the runs' own SPS (start-up included)
  flags     whole runs on MiniGrid Memory from images: the defaults, threads=1 eager and each
            --flags entry; SPS after the warm-up, env / act / learn ms, peak RSS
  compile   the wall time of one command line at compile=auto against compile=false (--hog:
            beside a CPU-bound process per other core)
  commit    this checkout against another one (--base): timed SPS, head / base
  runtime   IMPALA's runtimes (local, processes, Ray) against PPO, CartPole-v1

    python benchmarks/speed.py --vary acting --repeats 300
    python benchmarks/speed.py --vary agent --updates 4
    python benchmarks/speed.py --vary rollout --envs 16 --agents gtrxl+long gru --compile --amp
    python benchmarks/speed.py --vary defaults --steps 25000 --rounds 2
    python benchmarks/speed.py --vary flags --warmup 6 --updates 12
    python benchmarks/speed.py --vary compile --env CartPole-v1 --steps 100000 --hog
    python benchmarks/speed.py --vary commit --base /tmp/base --rounds 3
    python benchmarks/speed.py --vary runtime --steps 30720 --warmup 2560 --actors 1 2 4 --ray 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MINIGRID, ROOT, paired, ratio_median, table, timed, train
from speed_inprocess import ROLLOUT_AGENTS, acting, agent, rollout

SPLIT = ("env_ms", "act_ms", "learn_ms")
T1_EAGER = ["torch_threads=1", "compile=false"]  # the defaults before the auto choices


def threads_of(extra: list[str]) -> int | None:
    """OMP_NUM_THREADS for a row: its torch_threads; None (unset) for auto, every core offered."""
    return next((int(x.split("=")[1]) for x in extra if x.startswith("torch_threads=")), None)


def folder(tmp: str, name: str, r: int) -> Path:
    """A run folder for row ``name`` in round ``r``."""
    return Path(tmp) / f"{name.replace(' ', '_').replace('=', '-')}-{r}"


# ---- whole runs of flag rows: --vary defaults (vector, the runs' SPS), --vary flags -------

VECTOR = ["env=tmaze", "env.kwargs.length=30", "agent=trxl", "agent.layers=4", "agent.dim=64",
          "agent.heads=1", "agent.memory=16", "algo.num_steps=128", "progress=false",
          "tensorboard=false", "seed=1"]  # fmt: skip
FLAGS = ["torch_threads=2", "compile=true", "torch_threads=2 compile=true"]
MINIGRID_PER_UPDATE = 16 * 256


def flag_rows(args: argparse.Namespace) -> None:
    """The defaults, threads=1 eager and each --flags row as whole training runs: the runs'
    own SPS (--vary defaults) or the SPS after the warm-up with its split (--vary flags)."""
    warm = args.vary == "flags"
    if warm:
        warmup = max(args.warmup, 1) * MINIGRID_PER_UPDATE
        common = [*MINIGRID, f"total_steps={warmup + args.updates * MINIGRID_PER_UPDATE}"]
        print(
            f"MiniGrid-MemoryS9-v0 84x84x3, gtrxl 2 x 256 x 4 heads, M=64, 16 envs x 256 "
            f"steps; {args.warmup} warm-up + {args.updates} timed updates per row",
            flush=True,
        )
    else:
        common = [*VECTOR, f"total_steps={args.steps}"]
        print(
            f"T-maze 30, trxl 4 x 64 x 1 head, M=16, 16 envs x 128 steps, {args.steps} env "
            f"steps per run",
            flush=True,
        )
    rows = [("defaults", []), ("threads=1 eager", T1_EAGER)]
    rows += [(flags, flags.split()) for flags in args.flags]
    print(f"{args.rounds} round(s), {os.cpu_count()} cores", flush=True)

    def measure(name: str, extra: list[str], r: int) -> dict:
        run = folder(tmp, name, r)
        summary = train([*common, *extra, f"run_dir={run}"], threads_of(extra), args.timeout)
        row = timed(run, warmup, SPLIT) if warm else {"sps": summary["SPS"]}
        row["peak_rss_mb"] = summary["peak_rss_mb"]
        notes = "".join(f"\n    {note}" for note in summary["notes"])
        print(f"  round {r} {name}: {row['sps']:.1f} SPS{notes}", flush=True)
        return {name: row}

    with tempfile.TemporaryDirectory(prefix="rltrans-bench-speed-") as tmp:
        results = paired(rows, args.rounds, measure)
    sps = {name: [x["sps"] for x in runs] for name, runs in results.items()}
    head = [
        "row",
        "SPS",
        "x defaults",
        "x threads=1 eager",
        *(SPLIT if warm else ()),
        "peak RSS MB",
    ]
    lines = []
    for name, runs in results.items():
        split = [f"{statistics.median(x[k] for x in runs):.0f}" for k in SPLIT] if warm else []
        lines.append(
            [
                name,
                f"{statistics.median(sps[name]):.1f}",
                f"{ratio_median(sps[name], sps['defaults']):.2f}",
                f"{ratio_median(sps[name], sps['threads=1 eager']):.2f}",
                *split,
                f"{statistics.median(x['peak_rss_mb'] for x in runs):.0f}",
            ]
        )
    print("\n" + table(head, lines))
    what = "after the warm-up (charts/SPS); ms: mean per update" if warm else "the runs' own"
    print(f"\nSPS: wall-clock env steps/s, {what}; peak RSS: the training process's ru_maxrss.")


# ---- --vary compile: one command line's wall time at each compile setting -----------------

HOG = "while True: pass"


def compile_run(env_id: str, steps: int, setting: str, memory: Path, extra: list[str]) -> dict:
    """One training run; its wall time, summary SPS and compile=auto's report lines."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "rltrans.train",
            "env=gym",
            f"env.id={env_id}",
            f"total_steps={steps}",
            f"compile={setting}",
            "progress=false",
            "tensorboard=false",
            f"run_dir={tmp}/run",
            *extra,
        ]
        env = {**os.environ, "RLTRANS_COMPILE_MEMORY": str(memory)}
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    said = [line for line in done.stderr.splitlines() if line.startswith("compile=")]
    return {"wall_s": wall, "SPS": summary["SPS"], "said": said}


def compile_cost(args: argparse.Namespace) -> None:
    """Each --settings run (a fresh remembered decision each; --remembered: auto once more
    with the decision the first one kept), optionally beside the hogs; wall-time ratios."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = max(1, (cores or 2) - 1) if args.hog else 0
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]

    def measure(setting: str, _: None, r: int) -> dict:
        fresh = Path(tmp) / f"fresh-{setting}-{r}.json"  # no decision remembered yet
        out = {setting: compile_run(args.env, args.steps, setting, fresh, args.run)}
        if setting == "auto" and args.remembered:
            memory = Path(tmp) / f"remembered-{r}.json"
            if fresh.exists():
                memory.write_bytes(fresh.read_bytes())
            out["auto (remembered)"] = compile_run(args.env, args.steps, "auto", memory, args.run)
        for name, row in out.items():
            print(json.dumps({"round": r, "setting": name, **row}), flush=True)
        return out

    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = paired([(s, None) for s in args.settings], args.rounds, measure)
    finally:
        for hog in hogs:
            hog.kill()
    walls = {name: [x["wall_s"] for x in runs] for name, runs in results.items()}
    print(f"\n{args.env}, {args.steps:,} steps, {'with' if hogs else 'without'} a CPU hog")
    lines = [
        [
            f"compile={name}",
            f"{statistics.median(w):.1f}",
            f"{ratio_median(w, walls['false']):.2f}" if "false" in walls else "-",
        ]
        for name, w in walls.items()
    ]
    print(table(["setting", "wall s", "x compile=false's wall time"], lines))


# ---- --vary commit: this checkout against another ---------------------------------------

STEADY = ["torch_threads=1", "compile=false", "progress=false", "tensorboard=true"]
COMMIT_CONFIGS = {
    "vector": (
        ["env=tmaze", "agent=trxl", "agent.dim=64", "agent.layers=4", "agent.heads=1",
         "agent.memory=16", "env.num_envs=16", "algo.num_steps=128", "algo.num_minibatches=8",
         "algo.epochs=4", "seed=1"],
        2048,  # env steps per update
    ),
    "minigrid": ([a for a in MINIGRID if not a.startswith(("progress", "tensorboard"))], 4096),
}  # fmt: skip


def python_of(checkout: Path) -> str:
    """The checkout's own interpreter (its .venv), else this one."""
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def checkout_sps(
    checkout: Path, args: list[str], per_update: int, updates: int, out: Path
) -> float:
    """Timed SPS (after one warm-up update) of one run of ``args`` with ``checkout``'s code."""
    budget = [f"total_steps={per_update * (updates + 1)}", f"run_dir={out}"]
    train([*args, *STEADY, *budget], 1, None, checkout, python_of(checkout))
    return timed(out, per_update, ())["sps"]


def commit_ab(opts: argparse.Namespace) -> None:
    """Base and head in each round, which goes first alternating; the median ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in opts.configs:
            args, per_update = COMMIT_CONFIGS[name]

            def measure(side: str, checkout: Path, r: int) -> dict:
                out = Path(tmp, f"{name}-{side}-{r}")  # noqa: B023 (called in this loop)
                return {side: checkout_sps(checkout, args, per_update, opts.updates, out)}  # noqa: B023

            sps = paired([("base", opts.base), ("head", ROOT)], opts.rounds, measure)
            for r, (base, head) in enumerate(zip(sps["base"], sps["head"], strict=True)):
                print(
                    f"{name} round {r + 1}: base {base:.0f} SPS, head {head:.0f} SPS, "
                    f"head/base {head / base:.3f}",
                    flush=True,
                )
            ratios = [h / b for b, h in zip(sps["base"], sps["head"], strict=True)]
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{name}: head/base median {statistics.median(ratios):.3f} (rounds {spread})")


# ---- --vary runtime: IMPALA's runtimes against PPO --------------------------------------

IMPALA_PER_UPDATE = 32 * 8
IMPALA_COMMON = ["agent=mlp", "env=gym", "env.id=CartPole-v1", "env.num_envs=8",
                 "algo.num_steps=32", "algo.segment_length=16", "progress=false",
                 "tensorboard=true", "checkpoint_every=1000000", "seed=1"]  # fmt: skip
IMPALA_SPLIT = ("env_ms", "act_ms", "learn_ms", "queue_wait_ms")


def runtime_rows(algos: list[str], actors: list[int], ray: list[int]) -> list[tuple[str, list]]:
    """(row name, overrides): PPO, then per algo its local, process and Ray rows."""
    out = [("ppo", ["algo=ppo"])]
    for algo in algos:
        out.append((f"{algo} local", [f"algo={algo}", "runtime=local"]))
        for kind, counts in (("process", actors), ("ray", ray)):
            for k in counts:
                extra = [f"runtime={kind}", f"runtime.num_actors={k}", "runtime.envs_per_actor=8"]
                out.append((f"{algo} {kind} x{k}", [f"algo={algo}", *extra]))
    return out


def runtime(a: argparse.Namespace) -> None:
    """Every row a whole run; SPS after the warm-up, x the same algo's local row and x PPO."""
    round_up = lambda n: -(-n // IMPALA_PER_UPDATE) * IMPALA_PER_UPDATE  # noqa: E731
    warmup, steps = round_up(max(a.warmup, 1)), round_up(a.steps)  # >= the first update
    rows = runtime_rows(a.algos, a.actors, a.ray)
    print(
        f"CartPole-v1, mlp, T=32 x 8 envs = {IMPALA_PER_UPDATE} steps/update, warm-up "
        f"{warmup} + timed {steps} env steps, torch_threads={a.threads}, {os.cpu_count()} "
        "cores",
        flush=True,
    )

    def measure(name: str, extra: list[str], r: int) -> dict:
        run = folder(tmp, name, r)
        args = [
            *IMPALA_COMMON,
            *extra,
            f"total_steps={warmup + steps}",
            f"torch_threads={a.threads}",
            f"run_dir={run}",
        ]
        summary = train(args, a.threads, a.timeout)
        row = timed(run, warmup, (*IMPALA_SPLIT, "policy_lag"))
        row["lag"], row["summary_sps"] = row.pop("policy_lag"), summary["SPS"]
        print(
            f"  round {r} {name}: {row['sps']:.0f} SPS timed ({row['updates']} updates), "
            f"{summary['SPS']:.0f} SPS whole run incl. start-up",
            flush=True,
        )
        return {name: row}

    with tempfile.TemporaryDirectory(prefix="rltrans-bench-impala-") as tmp:
        results = paired(rows, a.rounds, measure)
    sps = {name: [x["sps"] for x in runs] for name, runs in results.items()}
    lines = []
    for name, _ in rows:
        med = lambda key: statistics.median(x[key] for x in results[name])  # noqa: B023, E731
        local = sps["ppo" if name == "ppo" else f"{name.split()[0]} local"]
        lines.append(
            [
                name,
                f"{med('sps'):.0f}",
                f"{ratio_median(sps[name], local):.2f}",
                f"{ratio_median(sps[name], sps['ppo']):.2f}",
                *(f"{med(k):.1f}" for k in IMPALA_SPLIT),
                f"{med('lag'):.2f}",
                f"{med('summary_sps'):.0f}",
            ]
        )
    print(
        "\n"
        + table(["row", "SPS", "x local", "x ppo", *IMPALA_SPLIT, "lag", "whole-run SPS"], lines)
    )
    print(
        "\nSPS: wall-clock env steps/s after the warm-up (from charts/SPS); splits: mean ms per"
        " update (env/act summed over actor processes); wait = learner waiting for a rollout;"
        " lag = mean policy lag of the trained rollouts; whole-run SPS: the JSON summary's"
        " (includes actor start-up)."
    )


# ---- the command line -------------------------------------------------------------------


def options(p: argparse.ArgumentParser, vary: str) -> None:
    """The options of one variation (each as the script it replaced had them)."""
    add = p.add_argument
    if vary in ("acting", "agent", "rollout", "runtime"):
        add("--threads", type=int, default=1, help="torch threads")
    if vary in ("acting", "agent"):
        add("--no-compile", action="store_true", help="skip the compiled rows")
    if vary in ("agent", "rollout", "flags", "commit"):
        default = {"flags": 3, "commit": 4}.get(vary, 3)
        add("--updates", type=int, default=default, help="timed updates per row")
    if vary in ("defaults", "flags", "compile", "commit", "runtime", "acting"):
        default = {"defaults": 2, "commit": 3, "acting": 10}.get(vary, 1)
        add("--rounds", type=int, default=default, help="rounds over all rows")
    if vary in ("defaults", "flags", "runtime"):
        add(
            "--timeout",
            type=float,
            default={"defaults": 7200, "flags": 1800}.get(vary, 600),
            help="seconds per run",
        )
    if vary == "acting":
        add("--repeats", type=int, default=150, help="timed steps per variant, over the rounds")
    if vary in ("agent", "rollout"):
        add("--env", default="tmaze", help="torch-native task (default tmaze)")
    if vary == "rollout":
        add("--envs", type=int, nargs="+", default=[16, 64, 256])
        add("--agents", nargs="+", default=list(ROLLOUT_AGENTS), choices=list(ROLLOUT_AGENTS))
        add("--compile", action="store_true", help="also the compiled paths")
        add("--amp", action="store_true", help="also the device path, learner in bfloat16")
        add("--device", default="cpu")
        add("--out", default="runs/speed_rollout.json", help="the rows as JSON")
    if vary in ("defaults", "flags"):
        add("--flags", nargs="*", default=FLAGS if vary == "flags" else [], help="a row each")
    if vary == "defaults":
        add("--steps", type=int, default=25_000, help="env steps per run")
    if vary in ("flags", "runtime"):
        default = 1 if vary == "flags" else 2560
        add(
            "--warmup",
            type=int,
            default=default,
            help="updates before timing (>= 1)" if vary == "flags" else "env steps before timing",
        )
    if vary == "compile":
        add("--env", default="CartPole-v1", help="a Gymnasium id (module:Id too)")
        add("--steps", type=int, default=100_000, help="total_steps of each run")
        add("--settings", nargs="+", default=["auto", "false"])
        add("--hog", action="store_true", help="a CPU-bound process per other core")
        add("--remembered", action="store_true", help="auto again, remembering")
        add("--run", nargs="*", default=[], help="more overrides for every run")
    if vary == "commit":
        add("--base", type=Path, required=True, help="the other checkout")
        add("--configs", nargs="+", default=list(COMMIT_CONFIGS), choices=list(COMMIT_CONFIGS))
    if vary == "runtime":
        add("--steps", type=int, default=30720, help="timed env steps per row")
        add("--algos", nargs="+", default=["impala", "impala_paper"])
        add("--actors", type=int, nargs="+", default=[1, 2, 4])
        add("--ray", type=int, nargs="*", default=[], help="Ray actor counts (the ray extra)")


VARIATIONS = {
    "acting": acting,
    "agent": agent,
    "rollout": rollout,
    "defaults": flag_rows,
    "flags": flag_rows,
    "compile": compile_cost,
    "commit": commit_ab,
    "runtime": runtime,
}


def main(argv: list[str] | None = None) -> None:
    """Read --vary, then that variation's options; measure and print."""
    first = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False
    )
    first.add_argument("--vary", choices=list(VARIATIONS), help="what varies between rows")
    first.add_argument("-h", "--help", action="store_true")
    known, rest = first.parse_known_args(argv)
    if known.vary is None:
        if known.help:
            first.print_help()
            return
        first.error(f"--vary is required: one of {', '.join(VARIATIONS)}")
    p = argparse.ArgumentParser(
        prog=f"speed.py --vary {known.vary}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options(p, known.vary)
    args = p.parse_args([*rest, *(["--help"] if known.help else [])])
    args.vary = known.vary
    VARIATIONS[known.vary](args)


if __name__ == "__main__":
    main()
