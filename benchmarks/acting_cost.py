"""Acting cost against episode length: does each memory's acting step stay flat?

Each agent is built from its shipped config (``agent=gtrxl``, ``agent=gtrxl
agent.long_memory=linear``, ``agent=gru``, ...) for passive_tmaze's spaces and acts N envs
through one episode that never ends, one step at a time, as a rollout does (no gradient;
eager, or with ``--compiled`` through the compiled acting step that ``compile=true`` uses).
Blocks of ``--block`` steps are timed starting at the episode steps given by ``--at``
(default 10, 1,000 and 100,000; every step in between is acted too, so the state is the one
a real episode of that length leaves). Each block is timed ``--rounds`` times in a row and
its median kept.

Printed: one markdown table (agent, then ms per acting step for all N envs at each episode
step, the ratio of the last to the first, and the ratio to the GRU at the same step), also
written as JSON to ``--out``.

    python benchmarks/acting_cost.py [--agents gtrxl gtrxl_linear gtrxl_delta gtrxl_additive
                                     gtrxl_compressive gru] [--envs 16] [--at 10 1000 100000]
                                     [--block 200] [--device cpu] [--compiled]
                                     [--out runs/acting.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from rltrans.accel.acting import compiled_acting
from rltrans.config import load_config
from rltrans.envs.torch_envs import make_torch_env
from rltrans.registry import build_agent

AGENTS: dict[str, list[str]] = {
    "gtrxl": ["agent=gtrxl"],
    "gtrxl_linear": ["agent=gtrxl", "agent.long_memory=linear"],
    "gtrxl_delta": ["agent=gtrxl", "agent.long_memory=delta"],
    "gtrxl_additive": ["agent=gtrxl", "agent.long_memory=additive"],
    "gtrxl_compressive": ["agent=gtrxl", "agent.long_memory=compressive"],
    "gru": ["agent=gru"],
    "lstm": ["agent=lstm"],
}


@torch.no_grad()
def acting_costs(
    overrides: list[str],
    envs: int,
    at: list[int],
    block: int,
    rounds: int,
    device: str = "cpu",
    compiled: bool = False,
) -> dict[int, float]:
    """ms per acting step (all envs) in blocks starting at each episode step in ``at``."""
    cfg = load_config(["env=passive_tmaze", *overrides], "train")
    env = make_torch_env("passive_tmaze", envs)
    torch.manual_seed(0)
    agent = build_agent(cfg.agent, env.single_observation_space, env.single_action_space)
    agent = agent.to(device).eval()
    # compiled: the transformer stacks act through their compiled step (as compile=true and
    # compile=auto runs do); the LSTM/GRU have none and act eagerly either way
    actor = (compiled_acting(agent) if compiled else None) or agent
    shape = env.single_observation_space.shape
    observations = torch.rand(64, envs, *shape, device=device)  # drawn before the clock starts
    state = agent.initial_state(envs)  # on the agent's device
    first = torch.ones(envs, dtype=torch.bool, device=device)
    later = torch.zeros(envs, dtype=torch.bool, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    step, costs = 0, {}

    def act(n: int) -> None:
        nonlocal state, step
        for _ in range(n):
            done = first if step == 0 else later
            _, state = actor.act(observations[step % 64], state, done)
            step += 1

    for start in sorted(at):
        act(start - step)  # walk the episode up to this step
        times = []
        for _ in range(rounds):
            sync()
            begin = time.perf_counter()
            act(block)
            sync()
            times.append((time.perf_counter() - begin) / block * 1e3)
        costs[start] = statistics.median(times)
    return costs


def main() -> None:
    """Time every agent, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--agents",
        nargs="+",
        choices=list(AGENTS),
        default=[*(a for a in AGENTS if a.startswith("gtrxl")), "gru"],
    )
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--at", nargs="+", type=int, default=[10, 1_000, 100_000])
    p.add_argument("--block", type=int, default=200, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3, help="timed blocks in a row per point")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where the agent acts (cpu, cuda)")
    p.add_argument("--compiled", action="store_true", help="act through the compiled step")
    p.add_argument("--out", default="runs/acting_cost.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for name in args.agents:
        results[name] = acting_costs(
            AGENTS[name], args.envs, args.at, args.block, args.rounds, args.device, args.compiled
        )
        print(f"# {name}: " + ", ".join(f"{v:.3f} ms" for v in results[name].values()), flush=True)
    at = sorted(args.at)
    head = " | ".join(f"step {a:,}" for a in at)
    rows = [
        f"| agent | {head} | last / first | / gru at step {at[-1]:,} |",
        "|---|" + "---|" * (len(at) + 2),
    ]
    for name, costs in results.items():
        cells = " | ".join(f"{costs[a]:.3f}" for a in at)
        to_gru = f"{costs[at[-1]] / results['gru'][at[-1]]:.2f}" if "gru" in results else "-"
        rows.append(f"| {name} | {cells} | {costs[at[-1]] / costs[at[0]]:.2f} | {to_gru} |")
    text = "\n".join(rows)
    where = f"{args.envs} envs on {args.device}{', compiled' if args.compiled else ''}"
    print(f"ms per acting step for {where} (median of {args.rounds} x {args.block} steps)")
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    facts = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    if torch.device(args.device).type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name()
    out.write_text(json.dumps({"args": vars(args), "facts": facts, "ms": results}, indent=1))


if __name__ == "__main__":
    main()
