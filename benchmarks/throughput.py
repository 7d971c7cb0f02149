"""Memory-policy speed: acting latency per step and PPO training SPS, as ratios in one run.

Part 1, acting latency (16 envs, memory M=64, vector observations, full agent.act):
  * GTrXL with the key/value cache (rltrans' acting path),
  * GTrXL re-projecting the memory's keys/values every step (memory of hidden states, no cache),
  * GTrXL recomputing the whole window of M+1 steps every step (no memory at all),
  * an LSTM policy of equal backbone parameter count, and one of equal width,
  at ~1M backbone parameters (3 layers x 128 and 2 layers x 160, 4 heads) and at 3 layers x
  384, 4 heads; with compile=true's compiled step as one more variant. "x lstm" is the median
  over rounds of the ratio to the parameter-matched LSTM measured in the same round.

Part 2, PPO training SPS on the small config of a popular PPO-TrXL script (4 layers x 64,
1 head, M=16, 16 envs x 128 steps, 8 minibatches x 4 epochs) for agent=trxl and agent=gtrxl
(each also with ff_mult=1, the reference layer's 1x MLP), split into env / act / learn time.
Process CPU time of the median update, updates of all rows interleaved.

    python benchmarks/throughput.py [--threads 1] [--repeats 200] [--updates 3] [--env tmaze]
                                    [--no-compile] [--skip-acting] [--skip-training]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from rltrans.accel.acting import compiled_acting
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.config import load_config, to_container

OBS = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
ACT = gym.spaces.Discrete(4)
ENVS, MEMORY = 16, 64
ROUNDS = 10  # acting: rounds of interleaved blocks per variant


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
        h = self.agent.backbone(self.window, None).hidden
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


def time_acting(act, repeats: int) -> float:
    """Median milliseconds per acting step after warm-up."""
    obs = torch.randn(ENVS, OBS.shape[0])
    for _ in range(10):
        act(obs)
    times = []
    for _ in range(repeats):  # process CPU time: robust to other load on a shared machine
        t0 = time.process_time()
        act(obs)
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def acting_rows(
    dim: int, layers: int, heads: int, repeats: int, compiled: bool = True
) -> list[tuple[str, int, float, float]]:
    """(name, backbone params, ms/step, x equal-params LSTM) for the acting variants."""
    torch.manual_seed(0)
    kw = {"dim": dim, "layers": layers, "heads": heads, "memory": MEMORY}
    gtrxl = MemoryAgent(OBS, ACT, backbone="gtrxl", **kw).eval()
    params = backbone_params(gtrxl)
    hidden = lstm_hidden_for(params, dim)
    lstm_p = MemoryAgent(OBS, ACT, backbone="lstm", dim=dim, layers=1).eval()
    lstm_p.backbone = torch.nn.LSTM(dim, hidden, batch_first=True)  # parameter-matched
    lstm_w = MemoryAgent(OBS, ACT, backbone="lstm", dim=dim, layers=1).eval()

    state = {"g": gtrxl.initial_state(ENVS), "w": lstm_w.initial_state(ENVS)}
    done = torch.zeros(ENVS, dtype=torch.bool)

    def cached(obs):
        out, state["g"] = gtrxl.act(obs, state["g"], done)
        return out.action

    fast = MemoryAgent(OBS, ACT, backbone="gtrxl", **kw).eval()
    fast.load_state_dict(gtrxl.state_dict())
    if compiled:
        fast = compiled_acting(fast) or fast
    state["c"] = fast.initial_state(ENVS)

    def compiled_step(obs):
        out, state["c"] = fast.act(obs, state["c"], done)
        return out.action

    def lstm_width(obs):
        out, state["w"] = lstm_w.act(obs, state["w"], done)
        return out.action

    hc = (torch.zeros(1, ENVS, hidden), torch.zeros(1, ENVS, hidden))
    head = torch.nn.Linear(hidden, ACT.n)
    value = torch.nn.Linear(hidden, 1)

    @torch.inference_mode()
    def lstm_params(obs):
        nonlocal hc
        y, hc = lstm_p.backbone(lstm_p.encoder(obs)[:, None], hc)
        value(y[:, 0])
        return torch.distributions.Categorical(logits=head(y[:, 0])).sample()

    lstm_param_count = sum(p.numel() for p in lstm_p.backbone.parameters())
    variants = [
        ("gtrxl, kv cache", params, cached),
        *([("gtrxl, kv cache, compile_step", params, compiled_step)] if compiled else []),
        ("gtrxl, memory without kv cache", params, HiddenMemoryNoCache(gtrxl).act),
        ("gtrxl, recompute window", params, RecomputeWindow(gtrxl).act),
        (f"lstm, equal params (h={hidden})", lstm_param_count, lstm_params),
        (f"lstm, equal width (h={dim})", backbone_params(lstm_w), lstm_width),
    ]
    samples = {name: [] for name, _, _ in variants}
    for _ in range(ROUNDS):  # interleave so that machine noise hits every variant alike
        for name, _, fn in variants:
            samples[name].append(time_acting(fn, max(1, repeats // ROUNDS)))
    # Per variant: the median over rounds, and its ratio to the parameter-matched LSTM as the
    # median of the per-round ratios (both measured within the same round).
    lstm = samples[variants[-2][0]]
    return [
        (name, p, statistics.median(samples[name]), ratio_median(samples[name], lstm))
        for name, p, _ in variants
    ]


def ratio_median(times: list[float], reference: list[float]) -> float:
    """Median over rounds of times / reference, round by round."""
    return statistics.median(t / r for t, r in zip(times, reference, strict=True))


# The reference's TrXL layer is attention plus a 1x ReLU projection (~5 D^2 parameters at one
# head); ours has a 4x MLP (~13 D^2 with W_kR). ff_mult=1 matches its parameter count.
SPS_ROWS = (
    ("trxl", "trxl", ()),
    ("trxl ff_mult=1", "trxl", ("agent.ff_mult=1",)),
    ("gtrxl", "gtrxl", ()),
    ("gtrxl ff_mult=1", "gtrxl", ("agent.ff_mult=1",)),
)
# The same with compile=true (torch.compile of the loss and the acting step; the first update,
# which compiles, is the warm-up and not counted).
COMPILED_ROWS = tuple(
    (f"{name} compile", agent, (*extra, "compile=true")) for name, agent, extra in SPS_ROWS
)


class PPOSetup:
    """One agent's PPO loop at the reference small config (4 layers x 64, 1 head, M=16, 16 envs
    x 128 steps, 8 minibatches x 4 epochs), stepped one update at a time."""

    def __init__(self, agent: str, env: str, updates: int, extra: tuple[str, ...] = ()) -> None:
        from rltrans.accel import Accel
        from rltrans.buffers.rollout import RolloutBuffer
        from rltrans.envs import make_env
        from rltrans.learners import PPOLearner, algo_settings
        from rltrans.registry import build_agent
        from rltrans.runtime.actors import LocalActor

        overrides = [
            f"agent={agent}",
            f"env={env}",
            "agent.dim=64",
            "agent.layers=4",
            "agent.heads=1",
            "agent.memory=16",
            *(["agent.long_memory=none"] if agent == "gtrxl" else []),  # the window alone
            "env.num_envs=16",
            "algo.num_steps=128",
            "algo.num_minibatches=8",
            "algo.epochs=4",
            *extra,
        ]
        cfg = load_config(overrides)
        torch.manual_seed(0)
        self.envs = make_env(cfg.env, seed=0)
        spaces = self.envs.single_observation_space, self.envs.single_action_space
        model = build_agent(cfg.agent, *spaces)
        self.algo = algo = cfg.algo
        self.buffer = RolloutBuffer(algo.num_steps, self.envs.num_envs, algo.segment_length, "cpu")
        self.actor = LocalActor(self.envs, model, seed=0, device="cpu")
        accel = Accel()
        settings = algo_settings(to_container(algo))
        self.learner = PPOLearner(model, settings, total_updates=updates + 1, accel=accel)
        accel.use_compiled(bool(cfg.compile))
        accel.act_through(self.actor, model)
        self.steps = algo.num_steps * self.envs.num_envs
        self.samples: list[dict[str, float]] = []

    def update(self) -> None:
        """One rollout and one PPO update; CPU seconds of collect (env/act split by their wall
        shares) and of learn."""
        t0 = time.process_time()
        self.actor.collect(self.buffer)
        buffer, algo = self.buffer, self.algo
        buffer.compute_advantages(self.actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
        t1 = time.process_time()
        self.learner.update(self.buffer)
        t2 = time.process_time()
        wall = self.actor.pop_timings()
        env_share = wall["env"] / max(wall["env"] + wall["act"], 1e-12)
        collect = t1 - t0
        self.samples.append(
            {"env": collect * env_share, "act": collect * (1 - env_share), "learn": t2 - t1}
        )

    def result(self) -> dict[str, float]:
        """SPS from the median update's CPU time (the first update is warm-up), and its split."""
        runs = sorted(self.samples[1:], key=lambda r: sum(r.values()))
        mid = runs[len(runs) // 2]
        return {"SPS": self.steps / sum(mid.values()), **mid}


def training_sps(
    env: str, updates: int, rows: tuple = SPS_ROWS
) -> list[tuple[str, dict[str, float]]]:
    """SPS of every row, their updates interleaved so machine noise hits all alike."""
    setups = [(name, PPOSetup(agent, env, updates, extra)) for name, agent, extra in rows]
    for _ in range(updates + 1):
        for _, setup in setups:
            setup.update()
    for _, setup in setups:
        setup.envs.close()
    return [(name, setup.result()) for name, setup in setups]


def main() -> None:
    """Print both tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=150)
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--env", default="tmaze", help="env config for the SPS part")
    p.add_argument("--skip-acting", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the compile=true rows")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, threads={args.threads}, envs={ENVS}, memory M={MEMORY}")
    if not args.skip_acting:
        for dim, layers, heads in ((128, 3, 4), (160, 2, 4), (384, 3, 4)):
            rows = acting_rows(dim, layers, heads, args.repeats, not args.no_compile)
            base = rows[0][2]
            print(f"\n## acting, {layers} layers x {dim}, {heads} heads")
            columns = f"{'backbone params':>15s} {'ms/step':>8s} {'x cached':>9s} {'x lstm':>7s}"
            print(f"{'variant':38s} {columns}")
            for name, params, ms, x_lstm in rows:
                print(f"{name:38s} {params:15,d} {ms:8.3f} {ms / base:9.2f} {x_lstm:7.2f}")
    if not args.skip_training:
        print(
            f"\n## PPO training, 4 layers x 64, 1 head, M=16, 16 envs x 128 steps, env={args.env}"
        )
        head = f"{'agent':24s} {'SPS':>7s} {'env s':>7s} {'act s':>7s} {'learn s':>8s}"
        print(f"{head}  (per update)")
        rows = SPS_ROWS if args.no_compile else SPS_ROWS + COMPILED_ROWS
        for name, r in training_sps(args.env, args.updates, rows):
            print(f"{name:24s} {r['SPS']:7.0f} {r['env']:7.2f} {r['act']:7.2f} {r['learn']:8.2f}")


if __name__ == "__main__":
    main()
