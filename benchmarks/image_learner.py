"""The PPO update on MiniGrid images against this machine's fp32 peak, measured in one run.

One rollout of the MiniGrid config of ``benchmarks/speed.py --vary flags`` (gtrxl 2 x 256 x 4
heads, M=64, Nature CNN, 16 envs x 256 steps, 8 minibatches of 32 segments x 16 steps), then:

  * the FLOPs of one epoch of PPO updates (8 minibatches, forward and backward), counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matmuls);
  * the time of that epoch (median of ``--reps``, a fresh copy of the agent each time);
  * this machine's fp32 peak at the same thread count: a 2048^3 matmul, median of 5, measured
    between the epochs, so that load on the machine hits both alike;
  * the epoch's self time by kind of op (torch.profiler): convolution, matmul, and the rest,
    with the largest of the rest listed (layout copies, element-wise work, the optimizer).

Printed: GFLOP per epoch, the achieved GFLOP/s, the peak GFLOP/s and their ratio.

    python benchmarks/image_learner.py [--threads 2] [--reps 3] [train overrides ...]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import replace

import torch
from common import MINIGRID as COMMON
from torch.utils.flop_counter import FlopCounterMode

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import load_config, to_container
from rltrans.envs import make_env
from rltrans.learners import PPOLearner, algo_settings
from rltrans.registry import build_agent
from rltrans.runtime.actors import LocalActor

CONV = ("conv", "mkldnn_convolution")
MATMUL = ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm")


def matmul_gflops(n: int = 2048, reps: int = 5) -> float:
    """fp32 GFLOP/s of an n^3 matmul at the current thread count (median of reps)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def kind(op: str) -> str:
    """convolution | matmul | other, from an aten op's name."""
    name = op.removeprefix("aten::")
    if any(name.startswith(c) for c in CONV):
        return "convolution"
    if name in MATMUL:
        return "matmul"
    return "other"


def main() -> None:
    """Roll out once, then count, time and profile one epoch of PPO updates."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--reps", type=int, default=3, help="timed epochs (median)")
    parser.add_argument("overrides", nargs="*", help="train overrides (e.g. algo.chunk_obs_mb)")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_config([*COMMON, *a.overrides])
    envs = make_env(cfg.env, seed=0, device="cpu")
    agent = build_agent(to_container(cfg.agent), envs.single_observation_space,
                        envs.single_action_space)  # fmt: skip
    algo = cfg.algo
    buffer = RolloutBuffer(algo.num_steps, envs.num_envs, algo.segment_length, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
    envs.close()
    ppo = replace(algo_settings(to_container(algo)), epochs=1)

    def epoch(extra: torch.profiler.profile | FlopCounterMode | None = None) -> float:
        learner = PPOLearner(copy.deepcopy(agent), ppo, total_updates=10)
        t0 = time.perf_counter()
        if extra is None:
            learner.update(buffer, torch.Generator().manual_seed(0))
        else:
            with extra:
                learner.update(buffer, torch.Generator().manual_seed(0))
        return time.perf_counter() - t0

    counter = FlopCounterMode(display=False)
    epoch(counter)
    flops = counter.get_total_flops()
    epoch()  # warm-up
    times, peaks = [], []
    for _ in range(a.reps):
        times.append(epoch())
        peaks.append(matmul_gflops())
    seconds, peak = statistics.median(times), statistics.median(peaks)
    achieved = flops / seconds / 1e9

    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    epoch(profiler)
    by_kind: dict[str, float] = {}
    others = []
    for event in profiler.key_averages():
        k = kind(event.key)
        by_kind[k] = by_kind.get(k, 0.0) + event.self_cpu_time_total
        if k == "other":
            others.append((event.self_cpu_time_total, event.key, event.count))
    total = sum(by_kind.values())

    print(
        f"PPO update, MiniGrid 84x84x3, gtrxl 2 x 256 x 4 heads, M=64, {envs.num_envs} envs x"
        f" {algo.num_steps} steps, {algo.num_minibatches} minibatches; {a.threads} threads;"
        f" overrides: {' '.join(a.overrides) or 'none'}"
    )
    print(f"  FLOPs per epoch (conv + matmul, fwd + bwd): {flops / 1e9:.1f} GFLOP")
    print(f"  epoch time: {seconds:.2f} s (median of {a.reps}: "
          f"{', '.join(f'{t:.2f}' for t in times)})")  # fmt: skip
    print(f"  achieved: {achieved:.1f} GFLOP/s")
    print(f"  fp32 peak, 2048^3 matmul at {a.threads} threads: {peak:.1f} GFLOP/s "
          f"({', '.join(f'{p:.1f}' for p in peaks)})")  # fmt: skip
    print(f"  fraction of peak: {achieved / peak:.2f}")
    print("\n  self time by kind (profiled epoch):")
    for k in ("convolution", "matmul", "other"):
        print(f"    {k:12s} {by_kind.get(k, 0.0) / total:6.1%}")
    print("  largest of the rest:")
    for t, key, count in sorted(others, reverse=True)[:12]:
        print(f"    {key:44s} {t / total:6.1%}  ({count} calls)")


if __name__ == "__main__":
    main()
