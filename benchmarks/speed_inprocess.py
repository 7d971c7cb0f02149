"""The variations of benchmarks/speed.py measured inside one process (not scripts of their own).

``--vary agent``: PPO updates at the small config of a popular PPO-TrXL script (4 layers x 64,
1 head, M=16, 16 envs x 128 steps, 8 minibatches x 4 epochs) for agent=trxl and agent=gtrxl
(each also with ff_mult=1, the reference layer's 1x MLP; and compiled unless
``--no-compile``), process CPU time of the median update split into env / act / learn.

``--vary rollout``: for each env count N and agent (gtrxl with its window alone, gtrxl with
its default long memory, gru), the generic acting loop (``rollout=generic``) against the
device rollout (``rollout=device``), eager and with ``--compile`` compiled, with ``--amp``
also the device path with the learner under bfloat16 autocast; wall time of the median
update split into rollout and learning, then the env steps per second alone.

``--vary acting``: ms per acting step for 16 envs, M=64 (GTrXL with its key/value cache, its
compiled step, without the cache, recomputing the window; LSTMs of equal parameters and of
equal width), blocks of every variant interleaved over rounds.

Every setup of one call is built first and their updates (or acting blocks) interleaved, so
machine noise hits all alike; each row's ratio is to the reference row of the same call.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from common import ratio_median, table

from rltrans.accel import Accel
from rltrans.accel.acting import compiled_acting
from rltrans.accel.rollout import device_rollout
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import load_config, to_container
from rltrans.envs import make_env
from rltrans.learners import NonFiniteLossError, PPOLearner, algo_settings
from rltrans.registry import PLAN_KNOBS, build_agent
from rltrans.runtime.actors import LocalActor, RewardScaler

# The reference's TrXL layer is attention plus a 1x ReLU projection (~5 D^2 parameters at one
# head); ours has a 4x MLP (~13 D^2 with W_kR). ff_mult=1 matches its parameter count.
SMALL = ["agent.dim=64", "agent.layers=4", "agent.heads=1", "agent.memory=16",
         "env.num_envs=16", "algo.num_steps=128", "algo.num_minibatches=8",
         "algo.epochs=4"]  # fmt: skip
AGENT_ROWS = {  # --vary agent: row -> overrides (gtrxl with its window alone)
    "trxl": ["agent=trxl"],
    "trxl ff_mult=1": ["agent=trxl", "agent.ff_mult=1"],
    "gtrxl": ["agent=gtrxl", "agent.long_memory=none"],
    "gtrxl ff_mult=1": ["agent=gtrxl", "agent.long_memory=none", "agent.ff_mult=1"],
}
ROLLOUT_AGENTS = {  # --vary rollout: row name -> overrides (the defaults otherwise)
    "gtrxl": ["agent=gtrxl", "agent.long_memory=none"],
    "gtrxl+long": ["agent=gtrxl"],
    "gru": ["agent=gru"],
}


class Setup:
    """One agent's PPO loop (``overrides`` on the train config), stepped one update at a time;
    each update's wall and process CPU seconds of the rollout (with advantages) and learning."""

    def __init__(
        self,
        overrides: list[str],
        *,
        rollout: str = "generic",
        compiled: bool = False,
        device: str = "cpu",
        amp: bool = False,
        updates: int = 1000,
    ) -> None:
        cfg = load_config(overrides)
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.envs = make_env(cfg.env, seed=0, device=self.device)
        spaces = self.envs.single_observation_space, self.envs.single_action_space
        agent_cfg = {k: v for k, v in to_container(cfg.agent).items() if k not in PLAN_KNOBS}
        model = build_agent(agent_cfg, *spaces).to(self.device)
        self.algo = algo = cfg.algo
        envs = self.envs.num_envs
        self.buffer = RolloutBuffer(algo.num_steps, envs, algo.segment_length, self.device)
        # as a training run does: the returns' scale only where algo.reward_scaling asks
        scaler = RewardScaler(envs, algo.gamma, self.device) if algo.reward_scaling else None
        path = device_rollout(rollout, self.envs)
        self.actor = LocalActor(
            self.envs, model, seed=0, device=self.device, reward_scaler=scaler, rollout=path
        )
        self.accel = accel = Accel()
        self.learner = PPOLearner(
            model, algo_settings(to_container(algo)), total_updates=updates, accel=accel
        )
        if amp:  # bfloat16 autocast on any device (a training run allows it only on CUDA)
            self.learner.amp, self.learner.amp_dtype = True, torch.bfloat16
        self.failed: str | None = None  # why the setup stopped (a non-finite gradient)
        accel.use_compiled(compiled)
        accel.act_through(self.actor, model, capture=path is not None)
        self.steps = algo.num_steps * envs
        self.samples: list[dict[str, float]] = []

    def sync(self) -> None:
        """Wait for the device (CUDA work is asynchronous)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def update(self) -> None:
        """One rollout (with advantages) and one PPO update (nothing once the setup failed)."""
        if self.failed is not None:
            return
        self.sync()
        w0, c0 = time.perf_counter(), time.process_time()
        self.actor.collect(self.buffer)
        buffer, algo = self.buffer, self.algo
        buffer.compute_advantages(self.actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
        self.sync()
        w1, c1 = time.perf_counter(), time.process_time()
        try:
            self.learner.update(buffer)
        except NonFiniteLossError as error:
            self.failed = str(error)
            return
        self.sync()
        w2, c2 = time.perf_counter(), time.process_time()
        wall = self.actor.pop_timings()  # the collect's env / act split by their wall shares
        env_share = wall["env"] / max(wall["env"] + wall["act"], 1e-12)
        self.samples.append(
            {
                "rollout": w1 - w0,
                "learn": w2 - w1,
                "env_cpu": (c1 - c0) * env_share,
                "act_cpu": (c1 - c0) * (1 - env_share),
                "learn_cpu": c2 - c1,
            }
        )

    def result(self, clock: str = "wall") -> dict[str, float]:
        """The median update by ``clock`` (wall: rollout + learn; cpu: process CPU time) and
        its SPS; the warm-up updates are cleared by the caller; NaN figures once failed."""
        keys = ("rollout", "learn") if clock == "wall" else ("env_cpu", "act_cpu", "learn_cpu")
        if self.failed is not None or not self.samples:
            return {"SPS": math.nan, **dict.fromkeys(keys, math.nan)}
        mid = sorted(self.samples, key=lambda s: sum(s[k] for k in keys))[len(self.samples) // 2]
        return {"SPS": self.steps / sum(mid[k] for k in keys), **{k: mid[k] for k in keys}}


def interleaved(setups: dict, warmup: int, updates: int) -> None:
    """``warmup`` + ``updates`` rounds of one update of every setup in turn; the warm-up
    updates (the first compiled ones compile) are not kept."""
    for i in range(warmup + updates):
        for key, setup in setups.items():
            setup.update()
            done = setup.failed if setup.failed is not None else setup.samples[-1]
            print(f"{key} update {i}: {done}", file=sys.stderr)
        if i < warmup:
            for setup in setups.values():
                setup.samples.clear()


def agent_rows(env: str, updates: int, compiled: bool) -> list[tuple[str, dict[str, float]]]:
    """--vary agent: each row's median update by process CPU time, eager (and compiled)."""
    modes = [False, True] if compiled else [False]
    setups = {
        f"{name}{' compile' if c else ''}": Setup(
            [*extra, f"env={env}", *SMALL], compiled=c, updates=updates + 1
        )
        for c in modes
        for name, extra in AGENT_ROWS.items()
    }
    interleaved(setups, 1, updates)
    for setup in setups.values():
        setup.envs.close()
    return [(name, setup.result("cpu")) for name, setup in setups.items()]


def rollout_rows(args) -> tuple[list[dict], dict[int, float]]:
    """--vary rollout: every (N, agent, path) row and the env steps per second alone."""
    modes = [False, True] if args.compile else [False]
    rows = []
    for n in args.envs:
        paths = [("generic", False), ("device", False)] + [("device", True)] * args.amp
        setups = {
            (agent, rollout, compiled, amp): Setup(
                [
                    *ROLLOUT_AGENTS[agent],
                    f"env={args.env}",
                    f"env.num_envs={n}",
                    "agent.horizon=32",
                ],
                rollout=rollout,
                compiled=compiled,
                device=args.device,
                amp=amp,
            )
            for agent in args.agents
            for compiled in modes
            for rollout, amp in paths
        }
        interleaved(setups, 2 if args.compile else 1, args.updates)
        for (agent, rollout, compiled, amp), setup in setups.items():
            base = setups[(agent, "generic", False, False)].result()["SPS"]
            r = setup.result()
            rows.append(
                {
                    "envs": n,
                    "agent": agent,
                    "rollout": rollout,
                    "compiled": compiled,
                    "amp": amp,
                    "SPS": r["SPS"],
                    "rollout_ms": 1e3 * r["rollout"],
                    "learn_ms": 1e3 * r["learn"],
                    "x_generic_eager": r["SPS"] / base,
                    "failed": setup.failed,
                }
            )
            setup.envs.close()
    return rows, {n: env_steps_per_s(args.env, n, args.device) for n in args.envs}


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


# ---- --vary acting: ms per acting step --------------------------------------------------

OBS = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
ACT = gym.spaces.Discrete(4)
ENVS, MEMORY = 16, 64
ROUNDS = 10  # rounds of interleaved blocks per variant


def backbone_params(agent: MemoryAgent) -> int:
    """Parameters of the backbone alone (encoder and heads excluded)."""
    return sum(p.numel() for p in agent.backbone.parameters())


def lstm_hidden_for(params: int, width: int) -> int:
    """Hidden size h of a 1-layer LSTM on width-dim inputs with about ``params`` parameters:
    4 (h*width + h*h + 2h) = params."""
    a, b, c = 4.0, 4.0 * (width + 2), -float(params)
    return round((-b + (b * b - 4 * a * c) ** 0.5) / (2 * a))


class RecomputeWindow:
    """Acting without any memory: rerun the stack on the last M+1 encoded inputs each step."""

    def __init__(self, agent: MemoryAgent) -> None:
        self.agent = agent
        self.window = torch.zeros(ENVS, MEMORY + 1, agent.backbone.dim)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """One step: slide the window, run the stack, sample from the last position."""
        self.window = torch.cat([self.window[:, 1:], self.agent.encoder(obs)[:, None]], dim=1)
        h = self.agent.backbone(self.window, None).hidden  # (N, M+1, D)
        return self.agent.policy(h[:, -1]).sample()


class HiddenMemoryNoCache:
    """Acting with a memory of hidden states whose keys/values are re-projected every step."""

    def __init__(self, agent: MemoryAgent) -> None:
        self.agent = agent
        self.memory = agent.backbone.empty_memory(ENVS)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """One step through the training forward with L=1."""
        h, self.memory, _ = self.agent.backbone(self.agent.encoder(obs)[:, None], self.memory)
        return self.agent.policy(h[:, 0]).sample()


def time_acting(act: Callable, repeats: int) -> float:
    """Median milliseconds per acting step after warm-up (process CPU time: robust to other
    load on a shared machine)."""
    obs = torch.randn(ENVS, OBS.shape[0])
    for _ in range(10):
        act(obs)
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        act(obs)
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def stepper(agent: MemoryAgent, done: torch.Tensor) -> Callable:
    """One acting step of ``agent`` through its own ``act``, keeping its state."""
    state = [agent.initial_state(ENVS)]

    def act(obs: torch.Tensor) -> torch.Tensor:
        out, state[0] = agent.act(obs, state[0], done)
        return out.action

    return act


def acting_variants(dim: int, layers: int, heads: int, compiled: bool) -> list[tuple]:
    """(name, backbone params, act function) of every acting variant at one size; the
    parameter-matched LSTM (the ratios' reference) is the one before last."""
    torch.manual_seed(0)
    kw = {"dim": dim, "layers": layers, "heads": heads, "memory": MEMORY}
    gtrxl = MemoryAgent(OBS, ACT, backbone="gtrxl", **kw).eval()
    params = backbone_params(gtrxl)
    hidden = lstm_hidden_for(params, dim)
    lstm_p = MemoryAgent(OBS, ACT, backbone="lstm", dim=dim, layers=1).eval()
    lstm_p.backbone = torch.nn.LSTM(dim, hidden, batch_first=True)  # parameter-matched
    lstm_w = MemoryAgent(OBS, ACT, backbone="lstm", dim=dim, layers=1).eval()
    done = torch.zeros(ENVS, dtype=torch.bool)
    fast = MemoryAgent(OBS, ACT, backbone="gtrxl", **kw).eval()
    fast.load_state_dict(gtrxl.state_dict())
    hc = [(torch.zeros(1, ENVS, hidden), torch.zeros(1, ENVS, hidden))]
    head, value = torch.nn.Linear(hidden, ACT.n), torch.nn.Linear(hidden, 1)

    @torch.inference_mode()
    def lstm_params(obs: torch.Tensor) -> torch.Tensor:
        y, hc[0] = lstm_p.backbone(lstm_p.encoder(obs)[:, None], hc[0])
        value(y[:, 0])
        return torch.distributions.Categorical(logits=head(y[:, 0])).sample()

    lstm_param_count = sum(p.numel() for p in lstm_p.backbone.parameters())
    compiled_step = stepper(compiled_acting(fast) or fast, done) if compiled else None
    return [
        ("gtrxl, kv cache", params, stepper(gtrxl, done)),
        *([("gtrxl, kv cache, compile_step", params, compiled_step)] if compiled else []),
        ("gtrxl, memory without kv cache", params, HiddenMemoryNoCache(gtrxl).act),
        ("gtrxl, recompute window", params, RecomputeWindow(gtrxl).act),
        (f"lstm, equal params (h={hidden})", lstm_param_count, lstm_params),
        (f"lstm, equal width (h={dim})", backbone_params(lstm_w), stepper(lstm_w, done)),
    ]


def acting_rows(
    dim: int, layers: int, heads: int, repeats: int, compiled: bool = True, rounds: int = ROUNDS
) -> list[tuple[str, int, float, float]]:
    """(name, backbone params, ms/step, x equal-params LSTM) for the acting variants: per
    variant the median over rounds, and its ratio to the parameter-matched LSTM as the median
    of the per-round ratios (both measured within the same round)."""
    variants = acting_variants(dim, layers, heads, compiled)
    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(rounds):  # interleave so that machine noise hits every variant alike
        for name, _, fn in variants:
            samples[name].append(time_acting(fn, max(1, repeats // rounds)))
    lstm = samples[variants[-2][0]]
    return [
        (name, p, statistics.median(samples[name]), ratio_median(samples[name], lstm))
        for name, p, _ in variants
    ]


# ---- what each variation prints ----------------------------------------------------------


def acting(args: argparse.Namespace) -> None:
    """--vary acting: a table per model size."""
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, threads={args.threads}, envs={ENVS}, memory M={MEMORY}")
    for dim, layers, heads in ((128, 3, 4), (160, 2, 4), (384, 3, 4)):
        rows = acting_rows(dim, layers, heads, args.repeats, not args.no_compile, args.rounds)
        base = rows[0][2]
        print(f"\n## acting, {layers} layers x {dim}, {heads} heads")
        lines = [
            [name, f"{params:,d}", f"{ms:.3f}", f"{ms / base:.2f}", f"{x_lstm:.2f}"]
            for name, params, ms, x_lstm in rows
        ]
        print(table(["variant", "backbone params", "ms/step", "x cached", "x lstm"], lines))


def agent(args: argparse.Namespace) -> None:
    """--vary agent: SPS by process CPU time, its split, and the ratio to trxl eager."""
    torch.set_num_threads(args.threads)
    print(
        f"## PPO training, 4 layers x 64, 1 head, M=16, 16 envs x 128 steps, env={args.env}, "
        f"threads={args.threads}; CPU s per update"
    )
    rows = agent_rows(args.env, args.updates, not args.no_compile)
    ref = rows[0][1]["SPS"]
    lines = [
        [
            name,
            f"{r['SPS']:.0f}",
            f"{r['SPS'] / ref:.2f}",
            f"{r['env_cpu']:.2f}",
            f"{r['act_cpu']:.2f}",
            f"{r['learn_cpu']:.2f}",
        ]
        for name, r in rows
    ]
    print(table(["agent", "SPS", "x trxl", "env s", "act s", "learn s"], lines))


def rollout(args: argparse.Namespace) -> None:
    """--vary rollout: the table, the env-alone rates, and both as JSON in --out."""
    torch.set_num_threads(args.threads)
    rows, env_rates = rollout_rows(args)
    print(f"\n{args.env} on {args.device}, {args.threads} thread(s), median of {args.updates}")
    head = [
        "N",
        "agent",
        "rollout",
        "compiled",
        "learner",
        "rollout ms",
        "learn ms",
        "SPS",
        "x generic eager",
    ]
    lines = []
    for r in rows:
        row = [
            str(r["envs"]),
            r["agent"],
            r["rollout"],
            str(r["compiled"]),
            "bf16" if r["amp"] else "fp32",
        ]
        if r["failed"] is not None:
            lines.append([*row, f"stopped: {r['failed']}", "", "", ""])
            continue
        lines.append(
            [
                *row,
                f"{r['rollout_ms']:.0f}",
                f"{r['learn_ms']:.0f}",
                f"{r['SPS']:,.0f}",
                f"{r['x_generic_eager']:.2f}",
            ]
        )
    print(table(head, lines))
    print(
        "\n"
        + table(["N", "env steps/s alone"], [[str(n), f"{v:,.0f}"] for n, v in env_rates.items()])
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "env_steps": env_rates}, indent=1))
