"""One resource estimate of a run, an evaluation or a collection, made once every setting is
final: after ``agent.horizon`` has been fitted, after a resume has taken its saved config,
after evaluate's or collect's command line (``num_envs``, episodes x targets) has been
combined with the checkpoint's config, and with the observation and action spaces where
they are known. It refuses (ConfigError, exit code 2) before anything is allocated or
spawned, naming the largest part and the keys that size it.

What it counts, each part a lower bound (``errs low``): the weights (with gradients and
Adam's two moments when training), the encoders and heads the spaces size, positional
tables (``learned``, ``shaw``), the acting state of every env (window memory, compressed
memory, long-memory matrices), the rollout and its stored segment memories, the activations
of one minibatch, a torch env's own buffers, IMPALA's shared-memory slots and its actor
processes (:data:`ACTOR_PROCESS_BYTES` each).

The counts that are not memory have fixed caps in the schema instead, the same on every
machine (a checkpoint or run folder moves between machines): :data:`MAX_THREADS` and
:data:`MAX_ACTORS`. Threads also reserve address space for their stacks, which a process
limited by ``ulimit -v`` may not have: :func:`thread_problems` refuses a thread count whose
stacks alone would not fit (without such a limit, :data:`MAX_THREADS` always fits).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from rltrans.config.errors import ConfigError, format_problems
from rltrans.config.frozen import thaw

# torch_threads: above every CPU count of today's machines; libgomp aborts the process
# (not a Python error) when asked for ~10^5 threads. Fixed, not a multiple of this machine's
# cores: a config saved on a large machine stays valid on a small one.
MAX_THREADS = 1024
# runtime.num_actors: actor processes (process, ray) or in-process actors (local). Fixed for
# the same reason; the memory estimate refuses fewer where the machine cannot hold them.
MAX_ACTORS = 512
# What one actor process holds at least: a Python interpreter with torch, its env and agent.
ACTOR_PROCESS_BYTES = 256 * 2**20
# A fresh run's budget smaller than one update of more than LONG_UPDATE env steps is refused:
# the budget would be rounded up to that update, and a stop signal is read between updates
# only, so it could not be stopped. Shorter roundings (seconds of work) are said on stderr
# (rltrans.run.context.Run.whole_updates).
LONG_UPDATE = 2**16
STACKS = ("gtrxl", "trxl", "trxl_i", "universal")
MATRIX_MEMORIES = ("linear", "delta", "additive", "mixed")
SEQUENCE_ENVS = ("autoencode",)  # torch envs that keep a per-env sequence of env.kwargs.length

Parts = dict[str, tuple[float, str]]


def physical_memory() -> int | None:
    """This machine's RAM in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# torch_threads=n starts two pools of n threads (OpenMP's and torch's own pthreadpool).
THREAD_POOLS = 2
# glibc's thread stack where ``ulimit -s`` is unlimited (x86-64; other CPUs use more).
DEFAULT_STACK = 2 * 2**20


def _stack_bytes() -> int:
    """The stack a new thread reserves: ``ulimit -s`` (OMP_STACKSIZE where smaller)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = DEFAULT_STACK if soft == resource.RLIM_INFINITY else soft
    given = re.fullmatch(r"\s*(\d+)\s*([bkmg]?)\s*", os.environ.get("OMP_STACKSIZE", ""), re.I)
    if given:  # OpenMP's own unit is kilobytes
        unit = {"b": 1, "": 2**10, "k": 2**10, "m": 2**20, "g": 2**30}[given[2].lower()]
        stack = min(stack, int(given[1]) * unit)
    return stack


def _mapped_bytes() -> int:
    """Address space this process maps now (Linux's VmSize; 0 where unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 2**10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def thread_problems(threads: Any, key: str = "torch_threads") -> list[str]:
    """One line when ``threads`` torch threads' stacks alone exceed the address space this
    process may still map (``ulimit -v``): the threads would fail to start, or leave no room
    for the next allocation (a MemoryError far from the cause); else none."""
    try:
        import resource  # POSIX only: elsewhere no ulimit -v to count against
    except ImportError:
        return []
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY or type(threads) is not int or threads < 2:
        return []
    stack = _stack_bytes()
    need, room = THREAD_POOLS * threads * stack, limit - _mapped_bytes()
    if need <= room:
        return []
    fits = max(1, room // (THREAD_POOLS * stack))
    return [
        f"{key}={threads} needs at least {need / 2**30:.1f} GiB of address space for thread "
        f"stacks (torch starts {THREAD_POOLS} x {threads} threads of {stack / 2**20:g} MiB, "
        f"ulimit -s), more than the {max(0, room) / 2**30:.1f} GiB this process may still map "
        f"(ulimit -v {limit / 2**30:.1f} GiB): lower {key} (at {fits} the stacks alone fill "
        f"it), or raise ulimit -v"
    ]


def check_threads(threads: Any, key: str = "torch_threads") -> None:
    """Raise ConfigError for :func:`thread_problems`: before torch is given the count."""
    problems = thread_problems(threads, key)
    if problems:
        raise ConfigError(format_problems(problems))


# ------------------------------------------------------------------------- spaces


def _flat(space: Any) -> int:
    """Flattened dimensions of a space (0 where unknown)."""
    import gymnasium as gym

    try:
        return int(gym.spaces.flatdim(space))
    except Exception:  # a space flatdim does not know (Graph, Sequence)
        return 0


def space_weights(space: Any, dim: int, hidden: int, *, action: bool) -> int:
    """A lower bound of the weights an encoder (``action=False``) or head of ``space`` has:
    an embedding or linear row of width ``dim`` per discrete value or output; a vector
    observation's first layer (``hidden`` wide). Images and unknown spaces count 0."""
    import gymnasium as gym

    s = gym.spaces
    if isinstance(space, s.Discrete):
        return int(space.n) * dim
    if isinstance(space, s.MultiDiscrete):
        return int(space.nvec.sum()) * dim
    if isinstance(space, s.Dict | s.Tuple):
        subs = space.spaces.values() if isinstance(space, s.Dict) else space.spaces
        return sum(space_weights(sub, dim, hidden, action=action) for sub in subs)
    if isinstance(space, s.Box | s.MultiBinary):
        if action:
            return _flat(space) * dim
        return _flat(space) * min(dim, hidden) if len(space.shape) <= 1 else 0
    return 0


# ------------------------------------------------------------------------- the estimate


def _layers(agent: dict) -> int:
    """The agent's layers (its backbone's default where null)."""
    return agent.get("layers") or (1 if agent.get("backbone") == "universal" else 2)


def _state_floats(agent: dict) -> tuple[float, float, str]:
    """Floats of one env's acting state per layer, those an acting step adds for a moment,
    and the keys that size them."""
    dim, heads = agent.get("dim") or 64, agent.get("heads") or 1
    if agent.get("kind") != "memory":  # DT/BC: a window of 3 tokens per step
        k = agent.get("context") or agent.get("history") or 1
        return 3.0 * k * dim, 0.0, "agent.context, agent.dim"
    backbone = agent.get("backbone")
    if backbone not in STACKS:  # recurrent: hidden (and cell) state
        return 2.0 * dim, 0.0, "agent.dim"
    floats = float(agent.get("memory") or 0) * dim  # each remembered step's input
    keys, transient = "agent.memory, agent.dim", 0.0
    long = agent.get("long_memory", "none")
    if long == "compressive":
        slots = agent.get("compressed_slots") or 0
        # keys and values, and the (Mc, Mc + 1) placement each acting step builds
        floats += 2.0 * slots * dim
        transient = slots * (slots + 1.0)
        floats += (agent.get("compression_rate") or 0) * dim
        keys = "agent.memory, agent.compressed_slots, agent.compression_rate, agent.dim"
    elif long in MATRIX_MEMORIES:
        floats += dim * dim / heads
    return floats, transient, keys


def _tables(agent: dict) -> tuple[float, str]:
    """Weights of the positional tables: ``learned`` (max_len x dim), ``shaw`` (two tables
    of 2 C + 1 rows per layer), a timestep embedding (max_timestep x dim)."""
    dim, heads, layers = agent.get("dim") or 64, agent.get("heads") or 1, _layers(agent)
    count, keys = float(agent.get("max_timestep") or 0) * dim, ["agent.max_timestep"]
    position = agent.get("position")
    if agent.get("kind") != "memory":  # DT: GPT-2's learned positions, 3 tokens per step
        count += 3.0 * (agent.get("context") or agent.get("history") or 1) * dim
        keys.append("agent.context")
    elif position == "learned":
        count += float(agent.get("max_len") or 1024) * dim
        keys.append("agent.max_len")
    if position == "shaw":
        count += layers * 2.0 * (2 * (agent.get("shaw_max_distance") or 16) + 1) * dim / heads
        keys.append("agent.shaw_max_distance")
    return count, ", ".join([*keys, "agent.dim"])


def _torch_env_floats(env: dict) -> tuple[float, str]:
    """Per-env numbers a torch-native env keeps: the sequence an autoencode episode shows
    (``length`` int64 cards, two floats each)."""
    name, size = env.get("name"), (env.get("kwargs") or {}).get("length")
    if env.get("kind") != "torch" or name not in SEQUENCE_ENVS or not isinstance(size, int):
        return 0.0, ""
    return 2.0 * size, "env.kwargs.length"


def estimate(
    cfg: dict, *, spaces: tuple[Any, Any] | None = None, acting_envs: int | None = None
) -> Parts:
    """The bytes a run (``acting_envs`` None) or an evaluation of ``acting_envs`` envs needs
    at least, by part: (bytes, the keys that size it). ``spaces`` (observation, action), when
    known, size the encoders and heads and the stored observations."""
    agent, algo, env, runtime = (cfg.get(k) or {} for k in ("agent", "algo", "env", "runtime"))
    training = acting_envs is None
    dim, heads, layers = agent.get("dim") or 64, agent.get("heads") or 1, _layers(agent)
    ff = agent.get("ff_mult") or 4
    hidden = (agent.get("encoder") or {}).get("hidden_dim") or 256
    per_layer = {"lstm": 8, "gru": 6, "mlp": 2}.get(agent.get("backbone"), 4 + 2 * ff)
    weights = float(layers * per_layer * dim * dim)
    weight_keys = "agent.dim, agent.layers"
    obs_floats = 1.0
    if spaces is not None:
        weights += space_weights(spaces[0], dim, hidden, action=False)
        weights += space_weights(spaces[1], dim, hidden, action=True)
        obs_floats = float(max(_flat(spaces[0]), 1))
        weight_keys += ", the observation and action spaces"
        if (algo.get("reconstruction_coef") or 0) > 0:
            weights += obs_floats * dim  # the decoder back to one observation
    per_weight = 16.0 if training else 4.0  # weights, gradients, Adam's two moments
    copies = " (weights, gradients, Adam)" if training else ""
    parts: Parts = {"model": (per_weight * weights, weight_keys + copies)}
    tables, table_keys = _tables(agent)
    parts["positional tables"] = (per_weight * tables, table_keys)
    kind = algo.get("kind")
    online = kind in ("online", "impala")
    if training and not online and kind != "offline":
        return parts
    remote = kind == "impala" and runtime.get("kind") in ("process", "ray")
    per_actor = (runtime.get("envs_per_actor") if remote else None) or env.get("num_envs") or 1
    actors = (runtime.get("num_actors") or 1) if kind == "impala" else 1
    if training:
        envs = per_actor * actors if online else 0
        env_keys = "env.num_envs" + (" x runtime.num_actors" if kind == "impala" else "")
    else:
        envs, env_keys = acting_envs, "num_envs (or episodes x targets)"
    state, transient, state_keys = _state_floats(agent)
    parts["acting state"] = (
        4.0 * envs * layers * (state + transient),
        f"{env_keys}, agent.layers, {state_keys}",
    )
    env_floats, env_state_keys = _torch_env_floats(env)
    if env_floats:
        parts["env state"] = (4.0 * envs * env_floats, f"{env_keys}, {env_state_keys}")
    activations = 4.0 * layers * (dim * (10 + 2 * ff))
    shaw = agent.get("position") == "shaw" and agent.get("kind") == "memory"
    reach = 2 * (agent.get("shaw_max_distance") or 16) + 1 if shaw else 0
    if not training:
        window = (agent.get("memory") or 0) + 1
        step = 4.0 * layers * (2 * heads * window + heads * reach) + activations
        parts["activations"] = (envs * step, f"{env_keys}, agent.memory, agent.dim")
        return parts
    if online:
        sizes = _Sizes(per_actor, actors, remote, obs_floats, layers, state, state_keys)
        tokens, context, act_keys = _rollout_parts(parts, agent, algo, runtime, sizes)
    else:  # offline
        k = algo.get("context") or agent.get("context") or agent.get("history") or 1
        tokens, context = (algo.get("batch_size") or 1) * 3.0, 3 * k
        act_keys = "algo.batch_size, agent.context, agent.dim, agent.layers"
    if shaw:
        act_keys += ", agent.shaw_max_distance"
    per_token = activations + 4.0 * layers * heads * (2 * context + reach)
    parts["activations"] = (tokens * per_token, act_keys)
    return parts


@dataclass(frozen=True)
class _Sizes:
    """What :func:`estimate` has worked out that sizes an online run's rollouts."""

    per_actor: int
    actors: int
    remote: bool
    obs_floats: float
    layers: int
    state: float
    state_keys: str


def _rollout_parts(
    parts: Parts, agent: dict, algo: dict, runtime: dict, sizes: _Sizes
) -> tuple[float, float, str]:
    """Add an online run's rollout (and actor slots) to ``parts``; returns the training
    step's tokens, attention context and the keys that size its activations."""
    per_actor, actors, remote = sizes.per_actor, sizes.actors, sizes.remote
    obs_floats, layers, state, state_keys = (
        sizes.obs_floats, sizes.layers, sizes.state, sizes.state_keys
    )  # fmt: skip
    kind = algo.get("kind")
    steps, length = algo.get("num_steps") or 1, algo.get("segment_length") or 1
    rollout = per_actor * steps * (obs_floats + 8.0) * 4.0
    segments = per_actor * steps / length * layers * state * 4.0
    keys = "algo.num_steps, algo.segment_length"
    if kind == "impala" and remote:
        slots = runtime.get("slots") or 2 * actors
        parts["actor slots"] = (
            slots * (rollout + segments),
            f"runtime.slots, env.num_envs or runtime.envs_per_actor, {keys}, {state_keys}",
        )
        parts["actor processes"] = (actors * float(ACTOR_PROCESS_BYTES), "runtime.num_actors")
    batches = algo.get("batch_rollouts") or 1
    parts["rollout"] = (
        (rollout + segments) * batches,
        f"env.num_envs, {keys}, algo.batch_rollouts, agent.layers, {state_keys}",
    )
    samples = per_actor * steps * batches / (algo.get("num_minibatches") or 1)
    chunk = agent.get("chunk") or length  # long segments train in chunks of agent.chunk
    context = (agent.get("memory") or 0) + min(length, chunk)
    if (algo.get("reconstruction_coef") or 0) > 0:
        samples_keys = "env.num_envs, algo.num_steps / algo.num_minibatches"
        parts["reconstruction"] = (samples * obs_floats * 8.0, samples_keys)
    act_keys = (
        "env.num_envs, algo.num_steps / algo.num_minibatches, agent.memory + "
        "algo.segment_length (or agent.chunk), agent.dim, agent.layers"
    )
    tokens = samples
    return tokens, context, act_keys


def memory_estimate(cfg: dict) -> Parts:
    """The training estimate of a config without its spaces (:func:`estimate`)."""
    return estimate(cfg)


def resource_problems(
    cfg: dict,
    *,
    spaces: tuple[Any, Any] | None = None,
    acting_envs: int | None = None,
    total: int | None = None,
) -> list[str]:
    """One line when the estimate (:func:`estimate`) exceeds ``total`` bytes (this machine's
    RAM by default), naming the largest part and its keys; else none."""
    total = physical_memory() if total is None else total
    if total is None:
        return []
    parts = estimate(cfg, spaces=spaces, acting_envs=acting_envs)
    need = sum(b for b, _ in parts.values())
    if need <= total:
        return []
    name, (largest, keys) = max(parts.items(), key=lambda item: item[1][0])
    horizon = (cfg.get("agent") or {}).get("horizon")
    fitted = f" (agent.horizon={horizon} fitted some of them)" if isinstance(horizon, int) else ""
    return [
        f"{'the run' if acting_envs is None else f'acting in {acting_envs} envs'} needs at least "
        f"{need / 2**30:.1f} GiB of memory, this machine has {total / 2**30:.1f} GiB; the "
        f"largest part, {name} ({largest / 2**30:.1f} GiB), grows with {keys}{fitted}: "
        "lower them"
    ]


def update_steps(cfg: dict) -> tuple[int, str] | None:
    """Env steps of one update of an online run and what they are made of (None offline)."""
    algo, env, runtime = (cfg.get(k) or {} for k in ("algo", "env", "runtime"))
    steps, envs = algo.get("num_steps") or 1, env.get("num_envs") or 1
    if algo.get("kind") == "online":
        return steps * envs, "algo.num_steps x env.num_envs"
    if algo.get("kind") == "impala":
        per = (runtime.get("envs_per_actor") if runtime.get("kind") != "local" else None) or envs
        made_of = "algo.batch_rollouts x algo.num_steps x envs per actor"
        return (algo.get("batch_rollouts") or 1) * steps * per, made_of
    return None


def budget_problems(cfg: dict) -> list[str]:
    """A fresh online run whose total_steps is smaller than one update of more than
    :data:`LONG_UPDATE` steps: a stop signal is read between updates only."""
    update, budget = update_steps(cfg), cfg.get("total_steps")
    if cfg.get("resume") or update is None or not isinstance(budget, int):
        return []
    steps, made_of = update
    if steps <= budget or steps <= LONG_UPDATE:
        return []
    return [
        f"total_steps={budget} is less than one update ({made_of} = {steps} steps), which "
        f"would round it up to {steps}; a stop signal is read only between updates: raise "
        f"total_steps to at least {steps} or make the update smaller"
    ]


def check_resources(
    cfg: Any, *, spaces: tuple[Any, Any] | None = None, acting_envs: int | None = None
) -> None:
    """Raise ConfigError when the final config (a DictConfig or plain dict) would not fit
    this machine or its budget would be rounded up past a stop (:func:`budget_problems`)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else thaw(cfg)
    problems = resource_problems(data, spaces=spaces, acting_envs=acting_envs)  # type: ignore[arg-type]
    if acting_envs is None:  # a run's config (evaluate and collect check their own threads)
        problems += budget_problems(data)  # type: ignore[arg-type]
        problems += thread_problems(data.get("torch_threads"))  # type: ignore[union-attr]
    if problems:
        raise ConfigError(format_problems(problems))


def weights_problem(cfg: dict, spaces: tuple[Any, Any], held: int) -> str | None:
    """A checkpoint whose spaces need more weights than its file holds (an edited space:
    building its agent would allocate them before the weights are found not to fit)."""
    agent = cfg.get("agent") or {}
    dim = agent.get("dim") or 64
    hidden = (agent.get("encoder") or {}).get("hidden_dim") or 256
    need = space_weights(spaces[0], dim, hidden, action=False)
    need += space_weights(spaces[1], dim, hidden, action=True)
    if need <= held:
        return None
    return (
        f"its observation and action spaces need at least {need} weights at agent.dim={dim}, "
        f"its weights hold {held}: the spaces or the config do not belong to these weights"
    )


# ------------------------------------------------------------------------- wrapper sizes


def wrapper_problems(wrappers: Any, max_length: int, max_steps: int, max_size: int) -> list[str]:
    """Integer keyword arguments of ``env.wrappers`` that size what a wrapper allocates
    (FrameStackObservation's stack_size, a shape): each at most ``max_length`` (step limits,
    ``*steps*``: ``max_steps``), a list's product at most ``max_size``."""
    problems = []
    for i, entry in enumerate(wrappers if isinstance(wrappers, list) else []):
        kwargs = entry.get("kwargs") if isinstance(entry, dict) else None
        for name, value in (kwargs or {}).items() if isinstance(kwargs, dict) else ():
            key = f"env.wrappers[{i}].kwargs.{name}"
            high = max_steps if "steps" in str(name) else max_length
            numbers = value if isinstance(value, list | tuple) else [value]
            ints = [v for v in numbers if isinstance(v, int) and not isinstance(v, bool)]
            if any(abs(v) > high for v in ints):
                problems.append(f"{key}={value!r}: expected integers of at most {high}")
            elif len(ints) > 1 and math.prod(abs(v) for v in ints) > max_size:
                problems.append(f"{key}={value!r}: a shape of more than {max_size} elements")
    return problems
