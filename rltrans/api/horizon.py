"""``agent.horizon``: one optional knob, in env steps, for how far a memory agent's window,
rollouts and training segments reach. It sets costs, never how to learn: no task needs it.

``auto`` (the memory agents' default) takes the distance from the env's time limit: a
torch-native task declares its own; a Gymnasium env is observed before the run, for
``PROBE_EPISODES`` episodes of uniformly random actions on one copy of it. Where every one of
them lasts the same L steps, the env has a fixed length (an episode that asks for an answer at
every step, or a time limit, declared or not) and D = L; where they differ, the length is up to
the agent, as in a cart-pole (a ``spec.max_episode_steps`` of 500 there is a truncation budget,
not a memory distance), and ``auto`` changes nothing. An integer D says it directly; ``null``
leaves the agent and the algo as configured. It reads nothing else of an env. For D steps:

* transformer stacks (gtrxl, trxl, trxl_i), D <= 256: ``agent.memory`` becomes at least D, so
  every layer reaches back D steps in one attention hop.
* transformer stacks, D > 256: the window stays, a long memory is added where none is
  configured (``mixed``; ``agent.long_memory=none`` on the command line keeps the window
  alone), and ``algo.num_steps`` becomes the shortest multiple of itself that spans D, trained
  as one segment in chunks of 64 steps (``agent.chunk``): the gradient of a step that reads
  the long memory reaches the step that wrote it.
* a ``linear``, ``delta``, ``additive`` or ``mixed`` memory: ``agent.retention_scale`` (the
  slowest head's initial time scale) becomes ``RETENTION_REACH`` (4) x D where that is longer
  than the default slowest head's (8192 steps with 4 heads): a head of that scale keeps
  exp(-1/4) = 78 % of a write after D steps.
* ``algo.segment_length`` becomes at least the shortest divisor of ``algo.num_steps`` that
  spans D steps (the whole rollout at most), keeping ``algo.num_minibatches`` segments per
  PPO update. A recurrent agent's rollout is not raised to span D.

Nothing else is lowered, and a value given on the command line stays. This is a step of
:func:`rltrans.api.resolve`: the run saves the resolved values, so resume and evaluation
rebuild the same agent. The measurements behind these rules are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rltrans.config.applies import RECURRENT
from rltrans.config.applies import WINDOWED as STACKS
from rltrans.config.compose import splitting_segment
from rltrans.core.long_memory import RETAINING, initial_scales

AUTO_WINDOW_CAP = 256  # the longest window horizon sets; beyond it, the delta long memory
AUTO_LONG_MEMORY = "mixed"  # beyond the cap, where none is configured
AUTO_CHUNK = 64  # beyond the cap, rollout-long segments run in chunks of this many steps
RETENTION_REACH = 4  # the slowest long-memory head starts at a time scale of this x D steps
PROBE_EPISODES = 3  # random-action episodes that observe a Gymnasium env's length
PROBE_STEPS = 4096  # an episode longer than this under random actions has no length taken


def time_limit(env_cfg: Any) -> int | None:
    """The configured env's time limit where it is known before the run: a torch-native
    task's (None for other kinds of env, and for a task without one)."""
    if env_cfg.get("kind") != "torch":
        return None
    from rltrans.envs.torch_envs import make_torch_env

    kwargs = dict(env_cfg.get("kwargs") or {})
    return make_torch_env(env_cfg.get("name"), 1, **kwargs).time_limit


def observed_length(env_cfg: Any, seed: int) -> int | None:
    """The one length of ``PROBE_EPISODES`` uniformly random-action episodes of a Gymnasium
    env (one copy, seeded with ``seed``); None where two differ or one outlasts PROBE_STEPS."""
    from rltrans.envs import make_env
    from rltrans.run.context import building

    config = {**OmegaConf.to_container(env_cfg, resolve=True), "num_envs": 1}
    with building("env"):  # an unknown id or a bad kwarg: one line, exit 2
        envs = make_env({**config, "vectorization": "sync"}, seed=seed)
    try:
        envs.reset(seed=seed)
        length, steps, seen = None, 0, 0
        while seen < PROBE_EPISODES:
            _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
            steps += 1
            if steps > PROBE_STEPS:
                return None
            if bool(terminated[0]) or bool(truncated[0]):
                if length is not None and steps != length:
                    return None
                length, steps, seen = steps, 0, seen + 1
        return length
    finally:
        envs.close()


def auto_distance(cfg: DictConfig) -> int | None:
    """``agent.horizon=auto``'s distance: a torch task's time limit, a Gymnasium env's
    observed fixed length (:func:`observed_length`), None where neither is known."""
    if cfg.env.get("kind") == "gym":
        return observed_length(cfg.env, int(cfg.get("seed") or 0))
    return time_limit(cfg.env)


def spanning_segment(distance: int, num_steps: int) -> int:
    """The shortest segment length that divides ``num_steps`` and spans ``distance`` steps
    (``num_steps`` where the distance is longer than the rollout)."""
    want = min(distance, num_steps)
    return next(d for d in range(want, num_steps + 1) if num_steps % d == 0)


def fits(cfg: DictConfig) -> bool:
    """Whether ``agent.horizon`` applies: set, on a windowed or recurrent backbone, online."""
    agent = cfg.agent
    backbone = agent.get("backbone")
    return (
        agent.get("horizon") is not None
        and backbone in (*STACKS, *RECURRENT)
        and cfg.algo.get("kind") != "offline"
    )


def fit_horizon(cfg: DictConfig, given: Collection[str] = ()) -> DictConfig:
    """``cfg`` fitted to ``agent.horizon`` (:func:`fitted`), where ``auto`` reads the env's
    length once (:func:`auto_distance`: the only step that builds an env, one copy)."""
    if not fits(cfg):
        return cfg
    horizon = cfg.agent.horizon
    return fitted(cfg, auto_distance(cfg) if horizon == "auto" else int(horizon), given)


def fitted(cfg: DictConfig, distance: int | None, given: Collection[str] = ()) -> DictConfig:
    """``cfg`` with agent.memory, agent.long_memory, agent.retention_scale,
    algo.segment_length and, beyond the window cap, algo.num_steps and agent.chunk fitted to
    ``distance`` steps (see the module docstring); agent.horizon becomes the distance used
    (None: nothing known, nothing changed). ``given``: keys set on the command line
    (``rltrans.api.resume.override_keys``), which keep the values given. A pure function
    of the config and the distance: it builds nothing."""
    if not fits(cfg):
        return cfg
    agent, algo = cfg.agent, cfg.algo
    backbone = agent.get("backbone")
    if distance is None:  # nothing known: as configured, and said so in the saved config
        OmegaConf.update(cfg, "agent.horizon", None, force_add=True)
        return cfg
    changes: dict[str, Any] = {"agent.horizon": distance}
    span_steps = distance
    beyond = backbone in STACKS and distance > AUTO_WINDOW_CAP
    chosen = "agent.long_memory" in given or agent.get("long_memory", "none") != "none"
    if beyond and not chosen:  # a long memory on the command line, none too, stays
        changes["agent.long_memory"] = AUTO_LONG_MEMORY
    long_memory = changes.get("agent.long_memory", agent.get("long_memory", "none"))
    retains = backbone in STACKS and long_memory in RETAINING and "retention_scale" in agent
    if retains and agent.retention_scale is None and "agent.retention_scale" not in given:
        longest = float(initial_scales(agent.heads)[-1])  # the default's slowest head
        if RETENTION_REACH * distance > longest:
            changes["agent.retention_scale"] = RETENTION_REACH * distance
    if backbone in STACKS and not beyond:
        changes["agent.memory"] = max(agent.memory, distance)
    elif beyond:
        span_steps = agent.memory  # without a rollout to span, the window's
        if "num_steps" in algo and "segment_length" in algo:
            # a rollout (and its one segment) spans the distance, run in chunks: the gradient
            # of the step that reads the long memory reaches the step that wrote it
            rollout = algo.num_steps * -(-distance // algo.num_steps)
            changes["algo.num_steps"] = span_steps = max(algo.num_steps, rollout)
            if agent.get("chunk") is None:
                changes["agent.chunk"] = AUTO_CHUNK
    if "segment_length" in algo and "num_steps" in algo:
        num_steps = changes.get("algo.num_steps", algo.num_steps)
        span = spanning_segment(span_steps, num_steps)
        if algo.get("kind") == "online":  # keep algo.num_minibatches' segments per update
            span = splitting_segment(num_steps, span, cfg.env.num_envs, algo.num_minibatches)
        changes["algo.segment_length"] = max(algo.segment_length, span)
    for key, value in changes.items():
        if key == "agent.horizon" or key not in given:  # a value given stays as given
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def horizon_note(cfg: DictConfig) -> str | None:
    """The line a fresh run prints on stderr about its fitted memory (None: nothing fitted)."""
    agent, algo = cfg.agent, cfg.algo
    if cfg.get("resume") or not isinstance(agent.get("horizon"), int):
        return None
    settings = []
    if agent.get("backbone") in STACKS:
        long = agent.get("long_memory", "none")
        settings += [f"agent.memory={agent.memory}", f"agent.long_memory={long}"]
        if agent.get("retention_scale") is not None:
            settings.append(f"agent.retention_scale={agent.retention_scale}")
    if "segment_length" in algo:
        settings.append(f"algo.segment_length={algo.segment_length}")
    beyond = agent.get("backbone") in STACKS and agent.horizon > AUTO_WINDOW_CAP
    if beyond and "num_steps" in algo:
        settings += [f"algo.num_steps={algo.num_steps}", f"agent.chunk={agent.get('chunk')}"]
    return f"agent.horizon={agent.horizon} steps: {', '.join(settings)}"
