"""Env steps per second of the torch-native memory tasks against POPGym's NumPy envs.

Each task steps N envs (1, 16, 256, 4096) with uniform random actions, drawn before the
clock starts: rltrans' batched env on CPU (and on CUDA when present, with action
validation off as a GPU training loop would run it), and, where POPGym has the task and
is installed (``pip install "rltrans[popgym]"``), POPGym's env in a Gymnasium
``SyncVectorEnv`` with the same SAME_STEP autoreset, on the same machine in the same run.
Both run POPGym's easy preset (passive_tmaze, which POPGym lacks: corridor 51). After a
warm-up, each row is timed over ``--rounds`` rounds of at least ``--seconds`` each, the two
envs taking turns within every round, and reports the median rate: env steps per second =
envs x vector steps / seconds.

Printed: one markdown table (task, device, envs, rltrans steps/s, popgym steps/s, ratio),
also written with the machine's facts to ``--out`` as JSON.

    python benchmarks/env_steps.py [--quick] [--envs 1 16 256 4096] [--tasks repeat_first ...]
                                   [--threads 1] [--out runs/env_steps.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs import TORCH_ENVS, make_torch_env

# Task -> rltrans kwargs (POPGym's easy preset where it has one), POPGym class path or None.
TASKS: dict[str, tuple[dict, str | None]] = {
    "repeat_first": (TORCH_ENVS["repeat_first"].popgym_presets["easy"], "RepeatFirstEasy"),
    "repeat_previous": (
        TORCH_ENVS["repeat_previous"].popgym_presets["easy"],
        "RepeatPreviousEasy",
    ),
    "count_recall": (TORCH_ENVS["count_recall"].popgym_presets["easy"], "CountRecallEasy"),
    "autoencode": (TORCH_ENVS["autoencode"].popgym_presets["easy"], "AutoencodeEasy"),
    "passive_tmaze": ({"length": 51}, None),
}
POOL = 64  # action batches drawn ahead and cycled through


def popgym_class(name: str) -> type | None:
    """POPGym's env class `name`, or None where POPGym is not installed."""
    try:
        import popgym.envs
    except ImportError:
        return None
    return getattr(popgym.envs, name)


def timed(step: Callable[[int], None], num_envs: int, seconds: float) -> float:
    """Env steps per second of `step(i)` (one vector step) over at least `seconds`."""
    start, steps = time.perf_counter(), 0
    while True:
        for _ in range(8):  # read the clock every 8 steps
            step(steps)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return num_envs * steps / elapsed


def rltrans_stepper(task: str, num_envs: int, device: str, warmup: int) -> Callable[[int], None]:
    """One vector step of the torch-native env, warmed up."""
    kwargs, _ = TASKS[task]
    env = make_torch_env(task, num_envs, device=device, validate_actions=device == "cpu", **kwargs)
    env.reset(seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    n = int(env.single_action_space.n)
    actions = torch.randint(0, n, (POOL, num_envs), generator=gen, device=device)
    cuda = device.startswith("cuda")

    def step(i: int) -> None:
        env.step(actions[i % POOL])
        if cuda and i % 8 == 7:
            torch.cuda.synchronize()  # `timed` reads the clock now: count the queued work

    for i in range(warmup - warmup % 8):
        step(i)
    return step


def popgym_stepper(cls: type, num_envs: int, warmup: int) -> Callable[[int], None]:
    """One vector step of POPGym's env in a SyncVectorEnv (SAME_STEP autoreset), warmed up."""
    env = gym.vector.SyncVectorEnv(
        [cls for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, int(env.single_action_space.n), (POOL, num_envs))

    def step(i: int) -> None:
        env.step(actions[i % POOL])

    for i in range(min(warmup, max(4, 4096 // num_envs))):
        step(i)
    return step


def measure(steppers: dict[str, Callable], num_envs: int, args: argparse.Namespace) -> dict:
    """Median rate of each stepper over `args.rounds` rounds, the steppers taking turns in
    every round so that a machine whose speed drifts slows them alike."""
    rates: dict[str, list[float]] = {name: [] for name in steppers}
    for _ in range(args.rounds):
        for name, step in steppers.items():
            rates[name].append(timed(step, num_envs, args.seconds))
    return {name: statistics.median(r) for name, r in rates.items()}


def main() -> None:
    """Measure every (task, device, envs) row, print the table, write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum time per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per row (median)")
    parser.add_argument("--warmup", type=int, default=50, help="vector steps before timing")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="short rounds: 0.25 s x 3")
    parser.add_argument("--out", type=Path, default=Path("runs/env_steps.json"))
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.warmup = 0.25, 3, 20
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    rows = []
    for task in args.tasks:
        cls = popgym_class(TASKS[task][1]) if TASKS[task][1] else None
        for device in devices:
            for num_envs in args.envs:
                steppers = {"rltrans": rltrans_stepper(task, num_envs, device, args.warmup)}
                # POPGym runs on the CPU whatever the device: measured once, on the CPU rows.
                if cls and device == "cpu":
                    steppers["popgym"] = popgym_stepper(cls, num_envs, args.warmup)
                rates = measure(steppers, num_envs, args)
                ours, theirs = rates["rltrans"], rates.get("popgym")
                rows.append(
                    {
                        "task": task,
                        "device": device,
                        "envs": num_envs,
                        "rltrans": ours,
                        "popgym": theirs,
                        "ratio": ours / theirs if theirs else None,
                    }
                )
                print(_row(rows[-1]), file=sys.stderr, flush=True)  # progress

    table = ["| task | device | envs | rltrans steps/s | popgym steps/s | ratio |"]
    table.append("|---|---|---:|---:|---:|---:|")
    table += [_row(r) for r in rows]
    print("\n".join(table))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "python benchmarks/env_steps.py" + (" --quick" if args.quick else ""),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": args.threads,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "popgym": _popgym_version(),
        },
        "timing": {"seconds": args.seconds, "rounds": args.rounds, "warmup": args.warmup},
        "rows": rows,
        "table": "\n".join(table),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def _row(r: dict) -> str:
    """One table row; POPGym's cells say why they are empty."""
    popgym = f"{r['popgym']:,.0f}" if r["popgym"] else _missing(r)
    ratio = f"{r['ratio']:.1f}x" if r["ratio"] else "-"
    return (
        f"| {r['task']} | {r['device']} | {r['envs']} | {r['rltrans']:,.0f} | {popgym} | {ratio} |"
    )


def _missing(r: dict) -> str:
    """Why a row has no POPGym number."""
    if TASKS[r["task"]][1] is None:
        return "no such task"
    return "not installed" if _popgym_version() is None else "(CPU rows)"


def _popgym_version() -> str | None:
    """The version of the POPGym that imports, or None."""
    from importlib.metadata import version

    try:
        import popgym  # noqa: F401
    except ImportError:
        return None
    return version("popgym")


if __name__ == "__main__":
    main()
