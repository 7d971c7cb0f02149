"""ProcessPool (IMPALA's runtime=process): actor start-up time and rollouts/s, 1 vs 2 actors.

CartPole-v1 with the mlp agent of configs/agent/mlp.yaml, rollouts of T=64 steps x N=4
envs, one torch thread per actor. The "learner" only takes and releases rollouts, so the
rate is what the actors can deliver. Start-up = from constructing the pool to every actor
having built its env and agent and received the weights (spawned processes import torch
and rltrans). The 2-actor rate can only approach 2x the 1-actor rate on a machine with at
least 3 free cores (two actors plus the learner process).

    python benchmarks/impala_pool.py [--seconds 10] [--start-method spawn|forkserver]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rltrans.envs import make_env
from rltrans.registry import build_agent
from rltrans.runtime.process import ProcessPool

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ENV = {"kind": "gym", "id": "CartPole-v1", "num_envs": 4}


def measure(agent_cfg: dict, num_actors: int, seconds: float, start_method: str) -> dict:
    """Start-up seconds and rollouts/s of one pool."""
    envs = make_env(ENV, seed=0)
    agent = build_agent(agent_cfg, envs.single_observation_space, envs.single_action_space)
    envs.close()
    with ProcessPool(
        agent_cfg, ENV, num_actors=num_actors, num_steps=64, segment_length=16, seed=0,
        start_method=start_method,
    ) as pool:  # fmt: skip
        pool.publish(agent.state_dict(), 0)
        startup = pool.wait_ready()
        for _ in range(2 * num_actors):  # warm-up
            pool.release(pool.get())
        pool.stats()  # the actor timings below cover the measured seconds only
        count, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            pool.release(pool.get())
            count += 1
        rate = count / (time.perf_counter() - t1)
        stats = pool.stats()
    return {"startup_s": startup, "rollouts_per_s": rate, "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--start-method", default="spawn", choices=["spawn", "forkserver"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    agent_cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "agent" / "mlp.yaml"))
    results = {}
    for n in (1, 2):
        results[n] = r = measure(agent_cfg, n, args.seconds, args.start_method)
        s = r["stats"]
        print(
            f"{n} actor(s): start-up {r['startup_s']:.2f} s, {r['rollouts_per_s']:.1f} rollouts/s "
            f"({r['rollouts_per_s'] * 64 * 4:.0f} steps/s); actors' env {s['env_ms'] / 1e3:.1f} s, "
            f"act {s['act_ms'] / 1e3:.1f} s, waiting for slots {s['actor_wait_ms'] / 1e3:.1f} s"
        )
    ratio = results[2]["rollouts_per_s"] / results[1]["rollouts_per_s"]
    print(f"2 actors / 1 actor: {ratio:.2f}x")


if __name__ == "__main__":
    main()
