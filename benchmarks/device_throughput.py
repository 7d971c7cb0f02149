"""PPO speed of the device rollout against the generic acting loop, by env count, in one run.

For each env count N and agent (gtrxl with its window alone, gtrxl with its default long
memory, gru), one PPO setup per path: the generic loop (``rollout=generic``) and the device
rollout (``rollout=device``), eager and, with ``--compile``, compiled (the learner's step
and the transformer's acting step). Every setup trains the torch-native task at the
default agent size and PPO settings (T=128 steps per env, 8 minibatches, 4 epochs); their
updates are interleaved, so machine noise hits all alike. A row gives the median update's
wall time split into rollout and learning, the SPS of whole updates (env steps per second
of wall time, rollout + advantages + learning) and its ratio to the generic eager path of the
same agent and N. The env steps per second alone (random actions, no agent) come last.

``--amp`` adds the device path with the learner under bfloat16 autocast (``algo.amp``), on
any device: the training run ignores ``algo.amp`` on CPU, and these rows show why. A setup
whose gradient turns non-finite stops and is reported as such.

    python benchmarks/device_throughput.py                       # CPU: N = 16, 64, 256
    python benchmarks/device_throughput.py --envs 16 --updates 4 --compile
    python benchmarks/device_throughput.py --device cuda --envs 256 4096 65536 --compile
    python benchmarks/device_throughput.py --envs 16 --agents gtrxl+long --compile --amp

On CUDA the device rollout replays the acting step from a CUDA graph. Large N on a CPU takes
long: a rollout of 256 envs is 32,768 steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from rltrans.accel import Accel
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import load_config, to_container
from rltrans.envs import make_env
from rltrans.learners import NonFiniteLossError, PPOLearner, algo_settings
from rltrans.registry import PLAN_KNOBS, build_agent
from rltrans.runtime.actors import LocalActor, RewardScaler
from rltrans.trainers.ppo import device_rollout

AGENTS = {  # row name -> overrides (the defaults otherwise)
    "gtrxl": ["agent=gtrxl", "agent.long_memory=none"],
    "gtrxl+long": ["agent=gtrxl"],
    "gru": ["agent=gru"],
}


class Setup:
    """One agent's PPO on one path, stepped one update at a time."""

    def __init__(self, agent: str, env: str, envs: int, rollout: str, compiled: bool,
                 device: str, amp: bool = False) -> None:  # fmt: skip
        overrides = [*AGENTS[agent], f"env={env}", f"env.num_envs={envs}", "agent.horizon=32"]
        cfg = load_config(overrides)
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.envs = make_env(cfg.env, seed=0, device=self.device)
        spaces = self.envs.single_observation_space, self.envs.single_action_space
        agent_cfg = {k: v for k, v in to_container(cfg.agent).items() if k not in PLAN_KNOBS}
        model = build_agent(agent_cfg, *spaces).to(self.device)
        self.algo = algo = cfg.algo
        self.buffer = RolloutBuffer(algo.num_steps, envs, algo.segment_length, self.device)
        scaler = RewardScaler(envs, algo.gamma, self.device)
        path = device_rollout(rollout, self.envs)
        self.actor = LocalActor(self.envs, model, seed=0, device=self.device,
                                reward_scaler=scaler, rollout=path)  # fmt: skip
        accel = Accel()
        settings = algo_settings(to_container(algo))
        self.learner = PPOLearner(model, settings, total_updates=1000, accel=accel)
        if amp:  # bfloat16 autocast on any device (a training run allows it only on CUDA)
            self.learner.amp, self.learner.amp_dtype = True, torch.bfloat16
        self.failed: str | None = None  # why the setup stopped (a non-finite gradient)
        accel.use_compiled(compiled)
        accel.act_through(self.actor, model, capture=path is not None)
        self.steps = algo.num_steps * envs
        self.samples: list[tuple[float, float]] = []

    def sync(self) -> None:
        """Wait for the device (CUDA work is asynchronous)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def update(self) -> None:
        """One rollout (with advantages) and one PPO update; wall seconds of each (nothing once
        the setup has failed)."""
        if self.failed is not None:
            return
        self.sync()
        t0 = time.perf_counter()
        self.actor.collect(self.buffer)
        buffer, algo = self.buffer, self.algo
        buffer.compute_advantages(self.actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
        self.sync()
        t1 = time.perf_counter()
        try:
            self.learner.update(buffer)
        except NonFiniteLossError as error:
            self.failed = str(error)
            return
        self.sync()
        self.samples.append((t1 - t0, time.perf_counter() - t1))
        self.actor.pop_timings()

    def result(self) -> dict[str, float]:
        """The median update (the first ones, which compile, are left out by the caller); NaN
        figures for a failed setup."""
        if self.failed is not None or not self.samples:
            return {"SPS": math.nan, "rollout_ms": math.nan, "learn_ms": math.nan}
        runs = sorted(self.samples, key=sum)
        rollout, learn = runs[len(runs) // 2]
        return {"SPS": self.steps / (rollout + learn), "rollout_ms": 1e3 * rollout,
                "learn_ms": 1e3 * learn}  # fmt: skip


def env_steps_per_s(env: str, envs: int, device: str, steps: int = 200) -> float:
    """Env steps per second of the torch-native env alone, random actions on the device."""
    cfg = load_config([f"env={env}", f"env.num_envs={envs}"])
    vec = make_env(cfg.env, seed=0, device=torch.device(device))
    vec.validate_actions = False
    vec.reset(seed=0)
    n = int(vec.single_action_space.n)
    actions = torch.randint(0, n, (steps, envs), device=vec.device)
    vec.step(actions[0])
    if vec.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in range(steps):
        vec.step(actions[t])
    if vec.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * envs / (time.perf_counter() - t0)


def main() -> None:
    """Parse the options, run the rows, print the table and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="tmaze", help="torch-native task (default tmaze)")
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=list(AGENTS))
    parser.add_argument("--updates", type=int, default=3, help="timed updates per setup")
    parser.add_argument("--compile", action="store_true", help="also the compiled paths")
    amp_help = "also the device path with the learner under bfloat16 autocast"
    parser.add_argument("--amp", action="store_true", help=amp_help)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="runs/device_throughput.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = [False, True] if args.compile else [False]
    rows = []
    for n in args.envs:
        paths = [("generic", False), ("device", False)] + [("device", True)] * args.amp
        setups = {
            (agent, rollout, compiled, amp): Setup(
                agent, args.env, n, rollout, compiled, args.device, amp
            )
            for agent in args.agents
            for compiled in modes
            for rollout, amp in paths
        }
        warmup = 2 if args.compile else 1  # the first compiled update compiles
        for i in range(warmup + args.updates):
            for key, setup in setups.items():
                setup.update()
                done = setup.failed if setup.failed is not None else setup.samples[-1]
                print(f"N={n} {key} update {i}: {done}", file=sys.stderr)
            if i < warmup:
                for setup in setups.values():
                    setup.samples.clear()
        for (agent, rollout, compiled, amp), setup in setups.items():
            base = setups[(agent, "generic", False, False)].result()["SPS"]
            result = setup.result()
            rows.append({"envs": n, "agent": agent, "rollout": rollout, "compiled": compiled,
                         "amp": amp, **result, "x_generic_eager": result["SPS"] / base,
                         "failed": setup.failed})  # fmt: skip
            setup.envs.close()
    env_rates = {n: env_steps_per_s(args.env, n, args.device) for n in args.envs}
    print(f"\n{args.env} on {args.device}, {args.threads} thread(s), median of {args.updates}")
    print("| N | agent | rollout | compiled | learner | rollout ms | learn ms | SPS | "
          "x generic eager |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        learner = "bf16" if r["amp"] else "fp32"
        row = f"| {r['envs']} | {r['agent']} | {r['rollout']} | {r['compiled']} | {learner} | "
        if r["failed"] is not None:
            print(f"{row}stopped: {r['failed']} | | | |")
            continue
        print(f"{row}{r['rollout_ms']:.0f} | {r['learn_ms']:.0f} | {r['SPS']:,.0f} | "
              f"{r['x_generic_eager']:.2f} |")  # fmt: skip
    print("\n| N | env steps/s alone |\n|---|---|")
    for n, rate in env_rates.items():
        print(f"| {n} | {rate:,.0f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "env_steps": env_rates}, indent=1))


if __name__ == "__main__":
    main()
