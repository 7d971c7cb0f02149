"""``agent.horizon``: one knob, in env steps, that fits a memory agent to the distance its task
asks it to remember over.

``auto`` (the memory agents' default) reads how far back the env may ask to remember, where
the env says so: a torch-native memory task's time limit (its whole episode). A Gymnasium
env's time limit is a truncation budget, not a memory distance (CartPole-v1: 500 steps), so
there ``auto`` changes nothing: give ``agent.horizon=<steps>``. An integer D says it
directly; ``null`` leaves the agent and the algo as configured. For a horizon of D steps:

* transformer stacks (gtrxl, trxl, trxl_i), D <= 256: ``agent.memory`` becomes at least D,
  so every layer reaches back D steps in one attention hop (a query reads the stored input of
  the step it needs, with no hop through intermediate steps that a stopped gradient could not
  teach to carry it).
* transformer stacks, where every answer aggregates the episode so far (a torch task whose
  ``aggregate`` is true: count-recall), at any D: ``agent.long_memory`` becomes ``additive``
  unless one is set (``agent.long_memory=none`` on the command line keeps the window
  alone). Softmax attention reads an average over the window, not a count, and the delta
  rule saturates at one writing per key; the sum rule's read grows with the count.
  On count-recall at POPGym's Medium preset (103 steps, 4 suits, gamma 0.01, 2M steps,
  seeds 1-3) the additive state beside the window reached 0.57 / 0.80 / 0.35 against
  -0.05 / 0.24 / -0.12 with delta (the GRU: -0.53 / -0.53 / -0.59), answering most steps
  right at every stage of the episode, where delta's answers failed once a count passed a
  handful.
* transformer stacks, D > 256: ``agent.long_memory`` becomes ``delta`` unless one is set (the
  whole episode at O(1) acting cost per step; steps repeated for hundreds of steps do not
  wash out what it holds), and the window stays as configured. ``algo.num_steps`` becomes
  the shortest multiple of itself that spans D, trained as one segment in chunks of 64
  steps (``agent.chunk``), so the gradient of the step that reads the long memory reaches
  the step that wrote it (with segments of the window's length, the cue's write was trained
  by the corridor's reads, and the decision's read stayed blind to it). Where the task asks
  for one decision per D steps (a torch task whose ``one_decision`` is true, the T-mazes, or
  an env that does not say), two learning settings follow it too: ``algo.gamma`` becomes at
  least 1 - 1/D (a discount horizon over the whole distance: the value of every step depends
  on the remembered cue once the policy does) and ``algo.ent_coef`` at least 0.05 (the rare
  decision keeps exploring until the memory is read; at 0.01 PPO settled on one arm first),
  each unless given on the command line.
  A task that answers at every step (repeat-first) keeps its own: with them raised, it
  stayed at chance at 415 steps; without, three of five seeds learned it within 600k steps.
* transformer stacks with a ``linear``, ``delta`` or ``additive`` memory (fitted or given):
  ``agent.retention_scale`` (the slowest head's initial time scale) becomes ``RETENTION_REACH``
  (4) x D where that is longer than the default slowest head's (8192 steps with 4 heads), unless
  given. A head of time scale 4 D keeps exp(-1/4) = 78 % of a write after D steps; at the
  passive T-maze 10,000 the default's slowest head kept 30 % and the cue moved its state at
  the junction by 0.48-0.50 against a norm of 1.0-1.7 (layer 0, two fresh agents), at 40,000
  by 1.26-1.32 against 1.4-2.0: what corridor 1,000 shows with the defaults (1.43-1.50),
  where PPO learned the task in 47-58 updates. With it, PPO learned corridor 10,000 in 91
  updates (seed 1: 95 % training success at 14.7M steps, 100 of 100 evaluated episodes).
* every memory agent, on a task that says it is ``myopic`` (no action changes what the task
  shows or pays later; each reward grades the action of its own step: count-recall,
  repeat-first, repeat-previous, autoencode): ``algo.gamma`` becomes ``MYOPIC_GAMMA`` (0.01)
  unless ``algo.gamma`` is on the command line. Every discount has the same best policy
  there, and at 0.99 each advantage carries the noise of the next ~100 steps' answers, whose
  rewards its action does not change: count-recall at POPGym's Medium preset, seed 1, 2M
  steps, went from -0.71 to -0.05 (gtrxl) and from -0.78 to -0.53 (GRU).
* every memory agent, on a myopic task with at least ``MANY_ANSWERS`` (16) actions to answer
  with (count-recall's counts): ``algo.ent_coef`` becomes at least ``MANY_ANSWERS_ENT_COEF``
  (0.03) unless ``algo.ent_coef`` is on the command line. The rarer answers (the high counts)
  come up in few steps of a rollout; at 0.01 the entropy collapsed before PPO had tried
  them, and the policy kept answering each of them wrong although its count was exact.
  On count-recall at POPGym's Medium preset (seeds 1-3, 3M steps) no seed of the
  transformer reached 0.9 at 0.01; at 0.03 every seed did, at 1.87M, 1.87M and 1.64M.
* ``algo.segment_length`` becomes at least the shortest divisor of ``algo.num_steps`` that
  spans D steps (the whole rollout at most), so gradients flow through D steps of one
  segment. PPO keeps at least ``algo.num_minibatches`` segments per update (env.num_envs x
  algo.num_steps / segment_length), so few envs cap the segment. A recurrent agent's
  rollout is not raised to span D: at repeat-first 415 the GRU with rollouts of 512 as one
  segment (a quarter of the updates, two segments per minibatch) ended at -0.43 / -0.42 /
  -0.46 after 1M steps, against 0.63 / 0.65 / 0.52 with rollouts and segments of 128.

Nothing else is lowered: a larger ``agent.memory`` or ``algo.segment_length`` on the command
line stays. The resolved values are what the run saves (its config.yaml and checkpoints), so
resume and evaluation rebuild the same agent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rltrans.core.long_memory import RETAINING, initial_scales

AUTO_WINDOW_CAP = 256  # the longest window horizon sets; beyond it, the delta long memory
AUTO_LONG_MEMORY = "delta"
AGGREGATE_LONG_MEMORY = "additive"  # where answers are counts over the episode
LONG_ENT_COEF = 0.05  # the entropy bonus at least, beyond the cap
AUTO_CHUNK = 64  # beyond the cap, rollout-long segments run in chunks of this many steps
MYOPIC_GAMMA = 0.01  # the discount on myopic tasks (each reward belongs to its own step)
MANY_ANSWERS = 16  # actions from which a myopic task gets the larger entropy bonus
MANY_ANSWERS_ENT_COEF = 0.03  # ... at least this one
RETENTION_REACH = 4  # the slowest long-memory head starts at a time scale of this x D steps
STACKS = ("gtrxl", "trxl", "trxl_i")
RECURRENT = ("lstm", "gru")


def configured_torch_env(env_cfg: Any) -> Any:
    """One env of the configured torch-native task, to read what it says about itself
    (``memory_distance``, ``one_decision``, ``aggregate``); None for other kinds of env."""
    if env_cfg.get("kind") != "torch":
        return None
    from rltrans.envs.torch_envs import make_torch_env

    kwargs = dict(env_cfg.get("kwargs") or {})
    return make_torch_env(env_cfg.get("name"), 1, **kwargs)


def spanning_segment(distance: int, num_steps: int) -> int:
    """The shortest segment length that divides ``num_steps`` and spans ``distance`` steps
    (``num_steps`` where the distance is longer than the rollout)."""
    want = min(distance, num_steps)
    return next(d for d in range(want, num_steps + 1) if num_steps % d == 0)


def fit_horizon(cfg: DictConfig, given: Collection[str] = ()) -> DictConfig:
    """``cfg`` with agent.memory, agent.long_memory, agent.retention_scale,
    algo.segment_length and, beyond the window cap, algo.num_steps, agent.chunk, algo.gamma
    and algo.ent_coef fitted to ``agent.horizon`` (see the module docstring); agent.horizon
    becomes the distance used.
    ``given``: keys set on the command line (``rltrans.run.override_keys``): a long memory
    (``none`` too), agent.retention_scale, algo.gamma and algo.ent_coef keep the values given."""
    agent, algo = cfg.agent, cfg.algo
    horizon = agent.get("horizon")
    backbone = agent.get("backbone")
    if horizon is None or backbone not in (*STACKS, *RECURRENT) or algo.get("kind") == "offline":
        return cfg
    env = configured_torch_env(cfg.env)
    if horizon == "auto":
        distance = None if env is None else env.memory_distance
        if distance is None:  # nothing known: as configured, and said so in the saved config
            OmegaConf.update(cfg, "agent.horizon", None, force_add=True)
            return cfg
    else:
        distance = int(horizon)
    changes: dict[str, Any] = {"agent.horizon": distance}
    span_steps = distance
    # where answers are sums (counts), not lookups, or beyond the window cap
    aggregate = env is not None and env.aggregate
    chosen = "agent.long_memory" in given or agent.get("long_memory", "none") != "none"
    if backbone in STACKS and not chosen:  # a long memory on the command line, none too, stays
        if aggregate:
            changes["agent.long_memory"] = AGGREGATE_LONG_MEMORY
        elif distance > AUTO_WINDOW_CAP:
            changes["agent.long_memory"] = AUTO_LONG_MEMORY
    long_memory = changes.get("agent.long_memory", agent.get("long_memory", "none"))
    retains = backbone in STACKS and long_memory in RETAINING and "retention_scale" in agent
    if retains and agent.retention_scale is None and "agent.retention_scale" not in given:
        longest = float(initial_scales(agent.heads)[-1])  # the default's slowest head
        if RETENTION_REACH * distance > longest:
            changes["agent.retention_scale"] = RETENTION_REACH * distance
    if backbone in STACKS and distance <= AUTO_WINDOW_CAP:
        changes["agent.memory"] = max(agent.memory, distance)
    elif backbone in STACKS:
        span_steps = agent.memory  # without a rollout to span, the window's
        if "num_steps" in algo and "segment_length" in algo:
            # a rollout (and its one segment) spans the distance, run in chunks: the gradient
            # of the step that reads the long memory reaches the step that wrote it
            rollout = algo.num_steps * -(-distance // algo.num_steps)
            changes["algo.num_steps"] = span_steps = max(algo.num_steps, rollout)
            if agent.get("chunk") is None:
                changes["agent.chunk"] = AUTO_CHUNK
        if env is None or env.one_decision:  # a decision task, or an env that does not say
            if "gamma" in algo and "algo.gamma" not in given:
                changes["algo.gamma"] = max(algo.gamma, 1.0 - 1.0 / distance)
            if "ent_coef" in algo and "algo.ent_coef" not in given:
                changes["algo.ent_coef"] = max(algo.ent_coef, LONG_ENT_COEF)
    if env is not None and env.myopic:
        if "gamma" in algo and "algo.gamma" not in given:
            changes["algo.gamma"] = MYOPIC_GAMMA
        many_answers = getattr(env.single_action_space, "n", 0) >= MANY_ANSWERS
        if many_answers and "ent_coef" in algo and "algo.ent_coef" not in given:
            ent_coef = changes.get("algo.ent_coef", algo.ent_coef)  # never below a floor above
            changes["algo.ent_coef"] = max(ent_coef, MANY_ANSWERS_ENT_COEF)
    if "segment_length" in algo and "num_steps" in algo:
        num_steps = changes.get("algo.num_steps", algo.num_steps)
        span = spanning_segment(span_steps, num_steps)
        if algo.get("kind") == "online":  # keep algo.num_minibatches' segments per update
            most = cfg.env.num_envs * num_steps // algo.num_minibatches
            span = max(d for d in range(1, min(span, most) + 1) if num_steps % d == 0)
        changes["algo.segment_length"] = max(algo.segment_length, span)
    for key, value in changes.items():
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
    if "gamma" in algo:
        settings.append(f"algo.gamma={algo.gamma:g}")
    if "ent_coef" in algo:
        settings.append(f"algo.ent_coef={algo.ent_coef:g}")
    return f"agent.horizon={agent.horizon} steps: {', '.join(settings)}"


def report_horizon(cfg: DictConfig) -> None:
    """Print :func:`horizon_note` on stderr, once the run has started."""
    note = horizon_note(cfg)
    if note is not None and int(os.environ.get("RANK", "0")) == 0:
        print(note, file=sys.stderr, flush=True)
