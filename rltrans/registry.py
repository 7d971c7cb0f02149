"""Agent classes by name: the only way a config (from the command line or a checkpoint file)
becomes a model.

An agent config names its class with ``kind`` (``memory``, ``dt``, ``bc`` or a name a user
registered); every other entry is a plain keyword argument of that class. Nothing in a
config is ever imported or called by path: Hydra-style ``_target_`` entries are refused
anywhere below the top level, and at the top level only the import paths rltrans itself
wrote in earlier versions (``agents.memory_agent.MemoryAgent`` and the like) are read, as
aliases of their registered names. Loading a checkpoint therefore runs no code but
rltrans's own constructors.

Example:
    >>> from rltrans.registry import register_agent
    >>> register_agent("my_agent", MyAgent)          # doctest: +SKIP
    >>> # then: python -m rltrans.train agent.kind=my_agent ...  (or a YAML with kind: my_agent)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from omegaconf import OmegaConf
from torch import nn

from rltrans.agents.dt import BehaviorCloning, build_decision_transformer
from rltrans.agents.memory_agent import MemoryAgent

AgentBuilder = Callable[..., nn.Module]


@dataclass(frozen=True)
class AgentEntry:
    """A registered agent: how to build it, and what kind of policy it is."""

    build: AgentBuilder  # (observation_space, action_space, **knobs) -> module
    return_conditioned: bool = False  # initial_state(n, target_returns); trained offline


_AGENTS: dict[str, AgentEntry] = {
    "memory": AgentEntry(MemoryAgent),
    "dt": AgentEntry(build_decision_transformer, return_conditioned=True),
    "bc": AgentEntry(BehaviorCloning, return_conditioned=True),  # knobs = its arguments
}

# Import paths that rltrans configs and checkpoints used before agents had names.
_LEGACY_TARGETS: dict[str, str] = {
    f"{prefix}{path}": name
    for prefix in ("", "rltrans.")
    for path, name in (
        ("agents.memory_agent.MemoryAgent", "memory"),
        ("agents.dt.DecisionTransformer", "dt"),
        ("agents.dt.BehaviorCloning", "bc"),
    )
}


# Build arguments an agent takes from the run's ``algo`` section, not from its own config: they
# weigh training losses, so they live with the algorithm (and default to 0 = off).
ALGO_AGENT_OPTIONS: tuple[str, ...] = ("reconstruction_coef",)


class RegistryError(ValueError):
    """An agent config names no registered class, or carries something that could run code."""


def register_agent(name: str, build: AgentBuilder, *, return_conditioned: bool = False) -> None:
    """Make ``build`` (a class or function) buildable as ``agent.kind=<name>``; it is called
    as ``build(observation_space, action_space, **knobs)``. A return-conditioned policy takes
    ``initial_state(n, target_returns)`` and trains with algo=offline."""
    if not name.isidentifier():
        raise ValueError(f"agent name {name!r} must be an identifier")
    entry = AgentEntry(build, return_conditioned)
    if name in _AGENTS and _AGENTS[name] != entry:
        raise ValueError(f"agent name {name!r} is taken by {_AGENTS[name].build.__qualname__}")
    _AGENTS[name] = entry


def registered_agents() -> list[str]:
    """Names usable as ``agent.kind``."""
    return sorted(_AGENTS)


def agent_entry(agent_cfg: Mapping[str, Any]) -> AgentEntry:
    """The registered agent a config names (``kind``, or a legacy ``_target_``)."""
    name = agent_cfg.get("kind")
    target = agent_cfg.get("_target_")
    if name is None and target is not None:
        name = _LEGACY_TARGETS.get(str(target))
        if name is None:
            raise RegistryError(
                f"agent._target_={target!r} is not an rltrans agent; configs name their class "
                f"with agent.kind, one of: {', '.join(registered_agents())} (rltrans never "
                f"imports a class named by a config or checkpoint)"
            )
    if name not in _AGENTS:
        raise RegistryError(
            f"agent.kind={name!r}; valid kinds: {', '.join(registered_agents())} "
            f"(register your own with rltrans.registry.register_agent)"
        )
    return _AGENTS[name]


def legacy_agent_name(target: Any) -> str | None:
    """The registered name of an agent import path rltrans itself once wrote, else None."""
    return _LEGACY_TARGETS.get(str(target))


def _refuse_targets(value: Any, path: str) -> None:
    """Raise on any ``_target_`` key below ``path`` (a config must hold plain values only)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "_target_":
                raise RegistryError(
                    f"{path}._target_={item!r}: a config may not name code to call; agent "
                    f"configs hold plain values (numbers, strings, lists, mappings)"
                )
            _refuse_targets(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_targets(item, f"{path}[{i}]")


# Agent config keys that the run plan reads and no agent class is given: ``horizon`` sizes
# the memory and the training segments before the agent is built (rltrans.api.horizon).
PLAN_KNOBS = ("horizon",)


def agent_knobs(agent_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of an agent config: everything but its class name and the keys
    the run plan reads (:data:`PLAN_KNOBS`), checked to hold plain values only."""
    skip = ("kind", "_target_", *PLAN_KNOBS)
    knobs = {k: v for k, v in agent_cfg.items() if k not in skip}
    _refuse_targets(knobs, "agent")
    return knobs


def build_agent(
    agent_cfg: Mapping[str, Any],
    observation_space: gym.Space,
    action_space: gym.Space,
    **extra: Any,
) -> nn.Module:
    """Build the agent a plain config describes for the given spaces.

    ``extra`` are build arguments that are not config knobs (a DT's dataset statistics).
    """
    if OmegaConf.is_config(agent_cfg):  # a composed config: plain values from here on
        agent_cfg = OmegaConf.to_container(agent_cfg, resolve=True)  # type: ignore[assignment]
    entry = agent_entry(agent_cfg)
    return entry.build(observation_space, action_space, **agent_knobs(agent_cfg), **extra)


def algo_agent_options(
    agent_cfg: Mapping[str, Any], algo_cfg: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The build arguments of :data:`ALGO_AGENT_OPTIONS` that a run's ``algo`` section sets,
    for ``build_agent(agent_cfg, ..., **these)``: ``algo.reconstruction_coef`` where it is
    above 0 (at 0 nothing is passed, so every agent builds as without the option). Raises
    RegistryError where the agent takes no such argument, or its own config sets one."""
    if OmegaConf.is_config(agent_cfg):
        agent_cfg = OmegaConf.to_container(agent_cfg, resolve=True)  # type: ignore[assignment]
    if OmegaConf.is_config(algo_cfg):
        algo_cfg = OmegaConf.to_container(algo_cfg, resolve=True)  # type: ignore[assignment]
    entry = agent_entry(agent_cfg)
    takes = inspect.signature(entry.build).parameters
    options: dict[str, Any] = {}
    for name in ALGO_AGENT_OPTIONS:
        if name in takes and name in agent_cfg:  # one place only: the algo section
            raise RegistryError(
                f"agent.{name}={agent_cfg[name]!r}: {name} is set as algo.{name} (the trainer "
                f"passes it to the agent); remove it from the agent config"
            )
        value = (algo_cfg or {}).get(name) or 0.0
        if not value:
            continue
        if name not in takes:
            kinds = [n for n in registered_agents() if name in _parameters(n)]
            kind = agent_cfg.get("kind") or agent_cfg.get("_target_")
            raise RegistryError(
                f"algo.{name}={value!r}: agent {kind!r} takes no {name}; valid agent kinds: "
                f"{', '.join(kinds)} (or set algo.{name}=0)"
            )
        options[name] = value
    return options


def _parameters(name: str) -> Mapping[str, inspect.Parameter]:
    """The build arguments of a registered agent."""
    return inspect.signature(_AGENTS[name].build).parameters
