"""The run's own settings typed: train.yaml's top-level keys (seed, budgets, the run folder,
checkpoints, speed modes, logging) and the ``runtime`` section (where IMPALA's actors run),
one field each with its default, range and help (:func:`rltrans.learners.settings.knob`).
The run plan carries them as ``plan.run`` and ``plan.runtime``; below the plan, trainers read
these fields, never the raw config. ``configs/train.yaml``'s keys and ``configs/runtime/*.yaml``
are written from them (:mod:`rltrans.config.settings_files`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rltrans.accel.rollout import Rollout
from rltrans.config.resources import MAX_ACTORS, MAX_THREADS
from rltrans.config.spec import SEED_MAX
from rltrans.envs.offline import DatasetKind
from rltrans.learners.settings import knob, settings_of
from rltrans.limits import MAX_ENVS, MAX_STEPS


@dataclass(frozen=True)
class RunSettings:
    """train.yaml's top-level keys: what one run is, where it writes and how it runs."""

    seed: int = knob(1, "seeds Python, NumPy, torch and the environments", low=0, high=SEED_MAX)
    device: str = knob("auto", "auto | cpu | cuda | cuda:<n> (auto = cuda when available)")
    total_steps: int = knob(
        100000,
        "online budget: environment steps to train for, summed over all envs",
        low=1,
        high=MAX_STEPS,
    )
    train_steps: int = knob(
        100000,
        "offline budget (algo=offline): gradient steps (DT paper: 1e5 for Gym)",
        low=1,
        high=MAX_STEPS,
    )
    dataset: str | None = knob(
        None,
        "offline data (algo=offline): a Minari id namespace/name-vN, or a d4rl-atari id "
        "{game}-{mixed|medium|expert|epoch-N}-v{0..4} (DQN Replay)",
    )
    dataset_kind: DatasetKind = knob(
        "auto",
        "auto | minari | dqn_replay (auto: an id with a namespace or present in "
        "$MINARI_DATASETS_PATH is Minari, a d4rl-atari id is DQN Replay)",
    )
    run_dir: str | None = knob(
        None,
        "output folder; null = runs/<env or dataset>-<agent>-s<seed>-<timestamp>",
        nonempty=True,
    )
    resume: bool = knob(
        False,
        "true = continue the run in run_dir from its last checkpoint, with its saved config; "
        "only budgets, checkpoint_every, keep_checkpoints, logging, progress, device, "
        "torch_threads and rollout may change (anything else is refused)",
    )
    overwrite: bool = knob(
        False,
        "true = a fresh run may replace a run_dir that holds another run's checkpoints (they "
        "are deleted); false = such a folder is refused",
    )
    trust_env_code: bool = knob(
        False,
        "true = let the files a run reads (a resumed run's config.yaml, an offline dataset's "
        "env spec) name code to import outside gymnasium, ale-py, minigrid and rltrans (an env "
        "id's module prefix, wrapper paths, wrappers that write files); false = refused. The "
        "command line is trusted as typed",
    )
    checkpoint_every: int = knob(
        25,
        "online: updates between checkpoints (one is always written at the end)",
        low=1,
    )
    keep_checkpoints: int = knob(3, "how many step checkpoints to keep besides last.pt", low=1)
    compile: bool | Literal["auto"] = knob(
        "auto",
        "torch.compile the learner's loss (forward + backward) and the acting step of the "
        "transformer and MLP agents (~1.7x faster updates on CPU after ~15-60 s of "
        "compilation); offline: the training step's loss. true | false | auto = time the first "
        "2 updates (offline: 20 gradient steps) eager; compile only where 10 % of the rest of "
        "the run exceeds ~60 s, with that 10 % as the compiling update's deadline (past it: "
        "dropped, eager); a compiled choice that is not 5 % faster goes back to eager; reported "
        "on stderr, kept in checkpoints and remembered per workload (rltrans-compile.json)",
    )
    torch_threads: int | Literal["auto"] = knob(
        "auto",
        "torch intra-op threads: auto = time the run's first learner steps and acting steps at "
        "1, 2, 4, ... cores (at most OMP_NUM_THREADS when set) and keep the fewest within 10 % "
        "of the fastest (small models: 1; image learners: more), reported on stderr and kept in "
        "checkpoints; an integer fixes it; 0 = torch's default",
        low=0,
        high=MAX_THREADS,
    )
    rollout: Rollout = knob(
        "auto",
        "PPO's rollout: auto = the device rollout for a torch-native env (env.kind=torch: env, "
        "acting step and buffer writes stay on the training device, episode statistics are "
        "read once per rollout, the acting step is replayed from a CUDA graph on a GPU), the "
        "generic loop otherwise | device = the device rollout (an error for other envs) | "
        "generic = the generic loop; both give the same rollout from the same seed",
    )
    progress: bool = knob(
        True,
        "progress bar (off a terminal: a compact line after the first update, then every 30 s; "
        "RLTRANS_PROGRESS_EVERY_S sets the interval)",
    )
    tensorboard: bool = knob(True, "write TensorBoard events to run_dir/tb")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RunSettings:
        """The top-level keys of a composed config (its sections and other keys left out)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: cfg[name] for name in names if name in cfg})


RUNTIME_KIND = (
    "local (actors in this process) | process (actor processes, shared memory) | ray (Ray actors)"
)
MAX_RESTARTS = "actor crashes restarted per actor before the run stops"
ENVS_PER_ACTOR = "envs of each actor's vector env; null = env.num_envs"


@dataclass(frozen=True)
class LocalRuntime:
    """``runtime=local``: IMPALA's actors in the training process, stepped round-robin."""

    kind: Literal["local"] = knob("local", RUNTIME_KIND)
    num_actors: int = knob(
        1, "actors, each stepping its own vector env of env.num_envs envs", low=1, high=MAX_ACTORS
    )


@dataclass(frozen=True)
class ProcessRuntime:
    """``runtime=process``: actor processes that fill shared-memory rollout slots."""

    kind: Literal["process"] = knob("process", RUNTIME_KIND)
    num_actors: int = knob(
        4,
        "actor processes (at most 512; the memory estimate counts 256 MiB each)",
        low=1,
        high=MAX_ACTORS,
    )
    envs_per_actor: int | None = knob(None, ENVS_PER_ACTOR, low=1, high=MAX_ENVS)
    slots: int | None = knob(
        None,
        "shared-memory rollout slots; null = 2 x num_actors (a rollout per actor in flight plus "
        "one being trained on); at most 2^20",
        low=1,
        high=MAX_ENVS,
    )
    start_method: Literal["spawn", "forkserver"] = knob(
        "spawn",
        "spawn | forkserver (multiprocessing start method; fork is unsafe with torch threads)",
    )
    max_restarts: int = knob(3, MAX_RESTARTS, low=0)


@dataclass(frozen=True)
class RayRuntime:
    """``runtime=ray``: Ray actors that act rollouts while the learner trains."""

    kind: Literal["ray"] = knob("ray", RUNTIME_KIND)
    num_actors: int = knob(
        4, "Ray actors, each stepping its own vector env", low=1, high=MAX_ACTORS
    )
    envs_per_actor: int | None = knob(None, ENVS_PER_ACTOR, low=1, high=MAX_ENVS)
    address: str | None = knob(
        None,
        'null = start a local Ray instance (stopped when training ends); "auto" or "host:port" '
        '/ "ray://host:port" = join that running cluster (never stopped; every node needs '
        "rltrans installed)",
    )
    num_cpus_per_actor: float = knob(
        1.0,
        "Ray CPUs each actor reserves (0.5 packs two per CPU); a local instance gets "
        "ceil(num_actors x this) CPUs",
        low=0.0,
    )
    rollouts_in_flight: int = knob(
        2,
        "rollout calls queued per actor, each acting with the weights newest when it was "
        "queued: 2 = it acts the next while the learner trains on the last; the policy lag is "
        "~ num_actors x this / algo.batch_rollouts updates",
        low=1,
        high=1024,
    )
    object_store_memory: int | None = knob(
        268435456,
        "bytes of a local instance's object store (256 MiB; >= 75 MiB; null = Ray's default, "
        "30% of memory): holds num_actors x rollouts_in_flight rollouts and the published "
        "weights; Ray spills to disk beyond it",
        low=75 * 2**20,
    )
    max_restarts: int = knob(3, "actor deaths restarted per actor before the run stops", low=0)


RuntimeSettings = LocalRuntime | ProcessRuntime | RayRuntime
RUNTIMES: dict[str, type] = {"local": LocalRuntime, "process": ProcessRuntime, "ray": RayRuntime}


def runtime_settings(runtime: Mapping[str, Any]) -> RuntimeSettings:
    """The typed ``runtime`` section, picked by its ``kind``. Raises ValueError for an
    unknown kind or a key that the kind does not have."""
    kind = runtime.get("kind", "local")
    if kind not in RUNTIMES:
        raise ValueError(f"runtime.kind={kind!r}; valid kinds: {', '.join(RUNTIMES)}")
    return settings_of(RUNTIMES[kind], runtime, section="runtime")


__all__ = [
    "RUNTIMES",
    "LocalRuntime",
    "ProcessRuntime",
    "RayRuntime",
    "RunSettings",
    "RuntimeSettings",
    "runtime_settings",
]
