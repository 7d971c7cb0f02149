"""Universal Transformer with ACT (agent=ut_act) against GTrXL at equal width, as ratios in one run.

Part 1, acting cost per step (16 envs, memory M, vector observations, full ``agent.act``):
  * GTrXL with Y = S layers (equal width and depth, S times the block parameters),
  * GTrXL with 2 layers (the gtrxl config's depth),
  * the Universal Transformer with ACT over up to S depth steps (one shared block),
  * the Universal Transformer without halting (exactly S steps: a weight-tied stack).
The ACT loop always runs S steps with halted tokens frozen (a static graph, no host sync),
so its cost is that of S layers plus the halting unit, whatever the tokens' ponder times.

Part 2, training cost per PPO minibatch: ``agent.evaluate`` on B segments of L steps with
their memory, forward + backward of a loss over log-probs, values and (for the UT) the ponder
cost, for the same four models.

Part 3 (``--ponder RUN_DIR``): where a trained ut_act policy ponders. Runs the policy in its
env and prints the halting steps N per token split by episode phase (first step, middle
steps, last step); on the T-maze the first step carries the cue and the last step is the
turn at the junction.

    python benchmarks/ut_act.py [--threads 1] [--dim 64] [--steps 4] [--memory 48]
    python benchmarks/ut_act.py --ponder runs/<ut_act run> --episodes 64

Learning comparison (T-maze corridor 30, success rate in the JSON summary; the ponder mean is
the TensorBoard scalar losses/ponder_mean):

    for a in ut_act gtrxl; do
      python -m rltrans.train agent=$a env=tmaze env.kwargs.length=30 total_steps=300000 \\
        torch_threads=1 progress=false run_dir=runs/tmaze30-$a
    done
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rltrans.agents.memory_agent import MemoryAgent
from rltrans.types import ActOutput, Segment

OBS = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
ACT = gym.spaces.Discrete(4)
ENVS = 16


def models(dim: int, steps: int, heads: int, memory: int) -> dict[str, MemoryAgent]:
    """The four compared agents at width ``dim``, keyed by a table label."""
    torch.manual_seed(0)
    kw = {"dim": dim, "heads": heads, "memory": memory}
    return {
        f"gtrxl, {steps} layers": MemoryAgent(OBS, ACT, backbone="gtrxl", layers=steps, **kw),
        "gtrxl, 2 layers": MemoryAgent(OBS, ACT, backbone="gtrxl", layers=2, **kw),
        f"ut_act, max_steps {steps}": MemoryAgent(
            OBS, ACT, backbone="universal", max_steps=steps, **kw
        ),
        f"ut, halting none, {steps} steps": MemoryAgent(
            OBS, ACT, backbone="universal", max_steps=steps, halting="none", **kw
        ),
    }


def params(agent: MemoryAgent) -> int:
    """Backbone parameters (encoder and heads excluded)."""
    return sum(p.numel() for p in agent.backbone.parameters())


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median process-CPU milliseconds of ``fn`` after warm-up (robust to other load)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def acting_fn(agent: MemoryAgent) -> Callable[[], object]:
    """One ``agent.act`` step of ENVS envs with a fresh per-env memory carried across calls."""
    agent.eval()
    box = {"state": agent.initial_state(ENVS)}
    obs, done = torch.randn(ENVS, OBS.shape[0]), torch.zeros(ENVS, dtype=torch.bool)

    def step() -> object:
        out, box["state"] = agent.act(obs, box["state"], done)
        return out

    return step


def training_fn(agent: MemoryAgent, batch: int, length: int) -> Callable[[], object]:
    """Forward + backward of one PPO-like minibatch of ``batch`` segments of ``length`` steps."""
    agent.train()
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(batch, length, OBS.shape[0], generator=g)
    memory = agent.state_to_memory(agent.initial_state(batch))
    memory = memory._replace(valid=torch.ones_like(memory.valid))  # a full window, as mid-episode
    segment = Segment(
        obs=obs,
        actions=torch.randint(0, ACT.n, (batch, length), generator=g),
        starts=torch.zeros(batch, length, dtype=torch.bool),
        memory=memory,
    )

    def update() -> object:
        log_prob, entropy, value, aux = agent.evaluate(segment)
        loss = -log_prob.mean() + value.pow(2).mean() - 0.01 * entropy.mean()
        loss = loss + sum((v for k, v in aux.items() if k.startswith("loss_")), torch.zeros(()))
        agent.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    return update


def timing_table(title: str, fns: dict[str, Callable[[], object]], agents, repeats: int) -> None:
    """Print ms per call and the ratio to the first row, rounds interleaved against noise."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(3):
        for name, fn in fns.items():
            samples[name].append(median_ms(fn, max(1, repeats // 3)))
    best = {name: min(v) for name, v in samples.items()}
    base = next(iter(best.values()))
    print(f"\n## {title}")
    print(f"{'model':30s} {'backbone params':>15s} {'ms':>8s} {'x first':>8s}")
    for name, ms in best.items():
        print(f"{name:30s} {params(agents[name]):15,d} {ms:8.3f} {ms / base:8.2f}")


class PonderRecorder:
    """Greedy acting with a ut_act agent that also keeps each step's halting steps N per env
    (the agent's own act() drops the backbone's aux); runs on the one acting loop."""

    def __init__(self, agent: MemoryAgent) -> None:
        self.agent = agent
        self.ponder: torch.Tensor | None = None  # (N,) N of the last step

    def initial_state(self, num_envs: int):
        return self.agent.initial_state(num_envs)

    @torch.no_grad()
    def act(self, obs, state, done, *, deterministic: bool = True):
        out = self.agent.backbone.step(self.agent.encode(obs), state, done)
        self.ponder = out.aux["ponder_steps"]
        action = self.agent.policy(out.hidden).mode()
        return ActOutput(action, self.agent.policy.env_action_tensor(action)), out.state

    def observe(self, state, reward):
        return state


def ponder_by_phase(run_dir: str, episodes: int) -> None:
    """Halting steps N per token of a trained ut_act policy, by episode phase."""
    from rltrans import load_policy
    from rltrans.envs import make_env
    from rltrans.runtime.episodes import EpisodeLoop

    policy = load_policy(run_dir)
    envs = make_env(policy.config["env"], seed=123, device="cpu", training=False)
    recorder = PonderRecorder(policy.agent)
    loop = EpisodeLoop(envs, recorder, seed=123, device="cpu", deterministic=True)
    current: list[list[float]] = [[] for _ in range(envs.num_envs)]
    phases: dict[str, list[float]] = {"first": [], "middle": [], "last": []}
    finished = 0
    while finished < episodes:
        step = loop.step()
        for i, steps in enumerate(recorder.ponder.tolist()):
            current[i].append(steps)
            if step.ended[i]:
                ep, current[i] = current[i], []
                phases["first"].append(ep[0])
                phases["middle"] += ep[1:-1]
                phases["last"].append(ep[-1])
                finished += 1
    envs.close()
    print(f"\n## ponder steps N per token, {finished} episodes of {run_dir} (greedy actions)")
    print(f"{'phase':8s} {'tokens':>7s} {'mean N':>7s}  histogram of N")
    for phase, values in phases.items():
        counts = np.bincount(np.asarray(values, dtype=int))
        hist = ", ".join(f"{k}: {c}" for k, c in enumerate(counts) if c)
        print(f"{phase:8s} {len(values):7d} {np.mean(values):7.3f}  {hist}")


def main() -> None:
    """Print the acting and training tables (or the ponder breakdown of a run)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="max_steps S (and GTrXL layers)")
    p.add_argument("--memory", type=int, default=48)
    p.add_argument("--batch", type=int, default=32, help="segments per training minibatch")
    p.add_argument("--length", type=int, default=16, help="segment length L")
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--ponder", metavar="RUN_DIR", help="only the ponder breakdown of a run")
    p.add_argument("--episodes", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.ponder:
        ponder_by_phase(args.ponder, args.episodes)
        return
    agents = models(args.dim, args.steps, args.heads, args.memory)
    print(
        f"# torch {torch.__version__}, threads={args.threads}, D={args.dim}, H={args.heads}, "
        f"S={args.steps}, M={args.memory}"
    )
    acting = {name: acting_fn(agent) for name, agent in agents.items()}
    timing_table(f"acting, ms per step ({ENVS} envs)", acting, agents, args.repeats)
    training = {name: training_fn(a, args.batch, args.length) for name, a in agents.items()}
    title = f"training, ms per minibatch (B={args.batch} x L={args.length}, forward + backward)"
    timing_table(title, training, agents, max(3, args.repeats // 4))


if __name__ == "__main__":
    main()
