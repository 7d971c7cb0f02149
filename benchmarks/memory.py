"""Where a PPO run's resident memory goes: the peak RSS of each phase of a real training run.

Runs ``python -m rltrans.train`` in this process (by default the MiniGrid image config of
``benchmarks/speed.py --vary flags``, 2 updates, one thread, eager) and prints, for each phase,
the peak resident set over the phase and the resident set at its end. Phases: the imports, each
setup call of the PPO trainer (env, agent, learner, ...), each rollout, GAE, each update and
checkpoint. The peak of a phase is exact, not sampled: Linux resets the process's high-water
mark (VmHWM) when "5" is written to /proc/self/clear_refs, so each phase starts from its own
current RSS. Linux only.

    python benchmarks/memory.py [train overrides, e.g. algo.chunk_obs_mb=null]
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import MINIGRID as COMMON

ROWS: list[tuple[str, int, int]] = []


def status_mb() -> tuple[int, int]:
    """(VmHWM, VmRSS) of this process in MB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) // 1024
    return values["VmHWM"], values["VmRSS"]


def mark(label: str) -> None:
    """Record the phase that ends here, then start the next one from the current RSS."""
    ROWS.append((label, *status_mb()))
    Path("/proc/self/clear_refs").write_text("5")


def phase(owner: Any, name: str, label: str | None = None) -> None:
    """Wrap ``owner.name`` so that each call is a phase of its own, numbered."""
    fn: Callable = getattr(owner, name)
    label = label or name
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        mark(f"(between) before {label} #{calls[0]}")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{label} #{calls[0]}")

    setattr(owner, name, wrapped)


def main() -> None:
    """Run the training with every phase wrapped, then print the table."""
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("needs Linux (/proc/self/clear_refs)")
    mark("python start")
    import rltrans.agents.memory_agent as agents
    import rltrans.trainers.ppo as ppo
    from rltrans import train
    from rltrans.buffers.rollout import RolloutBuffer
    from rltrans.learners import PPOLearner
    from rltrans.run.context import Run
    from rltrans.runtime.actors import LocalActor

    mark("imports")
    for name in ("make_env", "build_agent", "PPOLearner", "LocalActor", "speed"):
        phase(ppo, name)
    phase(LocalActor, "collect", "rollout")
    phase(RolloutBuffer, "compute_advantages", "GAE")
    phase(PPOLearner, "update", "update")
    phase(agents.MemoryAgent, "update_obs_norm", "obs norm")
    phase(Run, "save", "checkpoint")
    with tempfile.TemporaryDirectory(prefix="rltrans-bench-memory-") as tmp:
        overrides = [
            *(x for x in COMMON if not x.startswith("tensorboard=")),
            "tensorboard=false",
            "torch_threads=1",
            "compile=false",
            f"total_steps={2 * 16 * 256}",
            f"run_dir={tmp}/run",
            *sys.argv[1:],
        ]
        train.main(overrides)
    mark("end")
    print(f"\n{'phase':44s} {'peak MB':>8s} {'at end MB':>10s}")
    for label, peak, now in ROWS[1:]:
        if label.startswith("(between)") and peak == now:
            continue  # nothing happened between two phases
        print(f"{label:44s} {peak:8d} {now:10d}")


if __name__ == "__main__":
    main()
