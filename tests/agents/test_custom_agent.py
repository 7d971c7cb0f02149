"""A registered agent class takes its own keyword arguments from the command line with
``+agent.<name>=<value>``, though the preset's YAML leaves them out; a name it does not take
is still refused, naming the keys it does take."""

from __future__ import annotations

import gymnasium as gym
import pytest

from rltrans.agents.memory_agent import MemoryAgent
from rltrans.config import ConfigError, load_config
from rltrans.registry import build_agent, register_agent, registered_agents


class NamedKnobs(MemoryAgent):
    """Every argument named (the mlp preset's keys and ``value_hidden``, its own)."""

    def __init__(
        self, observation_space, action_space, *, value_hidden: int = 16, dim: int = 32,
        layers: int = 1, backbone: str = "mlp", heads: int = 4, memory: int = 8,
        encoder: dict | None = None, normalize_obs: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(
            observation_space, action_space, backbone=backbone, dim=dim, layers=layers,
            heads=heads, memory=memory, encoder=encoder, normalize_obs=normalize_obs,
        )  # fmt: skip
        self.value_hidden = value_hidden


class OpenKnobs(MemoryAgent):
    """``value_hidden`` and a ``**knobs`` catch-all passed on to the memory agent."""

    def __init__(self, observation_space, action_space, *, value_hidden: int = 16, **knobs):
        super().__init__(observation_space, action_space, **knobs)
        self.value_hidden = value_hidden


@pytest.fixture(scope="module", autouse=True)
def registered():
    for name, cls in (("test_named_knobs", NamedKnobs), ("test_open_knobs", OpenKnobs)):
        if name not in registered_agents():
            register_agent(name, cls)


@pytest.mark.parametrize("kind", ["test_named_knobs", "test_open_knobs"])
def test_an_argument_of_the_class_reaches_it_with_a_plus(kind):
    preset = ["agent=mlp"] if kind == "test_named_knobs" else []  # keys the class takes
    cfg = load_config([*preset, f"agent.kind={kind}", "+agent.value_hidden=48", "agent.dim=32"])
    assert cfg.agent.value_hidden == 48
    agent = build_agent(cfg.agent, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    assert agent.value_hidden == 48


def test_a_name_the_class_does_not_take_is_refused_naming_its_keys():
    with pytest.raises(ConfigError, match=r"agent\.valu_hidden.*value_hidden"):
        load_config(["agent=mlp", "agent.kind=test_named_knobs", "+agent.valu_hidden=48"])


def test_the_shipped_kinds_keep_their_key_tables():
    """The memory agent's own knobs are typed in the key tables; an unknown one is refused."""
    with pytest.raises(ConfigError, match=r"agent\.value_hidden"):
        load_config(["+agent.value_hidden=48"])
