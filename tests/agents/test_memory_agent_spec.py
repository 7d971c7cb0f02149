"""MemoryAgent built from a typed backbone spec: the same module, weights and acting as the
keywords of an agent config give (same seed), keywords next to a spec only where they agree
with it, and an agent from a spec that deep-copies and pickles with its spec."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.agents.memory_agent import MemoryAgent
from rltrans.backbones.causal import gpt2_config
from rltrans.backbones.spec import CausalSpec, MLPSpec, RNNSpec, StackSpec, UniversalSpec
from rltrans.core.block import BlockConfig
from tests.backbones.test_spec import CASES, IDS

D = 32
OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
ACT = gym.spaces.Discrete(3)


def keyword_agent(keywords, **agent_options) -> MemoryAgent:
    name, layers, heads, memory, options = keywords
    sizes = {"dim": D, "layers": layers, "heads": heads, "memory": memory}
    return MemoryAgent(OBS, ACT, backbone=name, **sizes, **options, **agent_options)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same state_dict keys in the same order, same shapes and dtypes, equal values."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].shape == sb[key].shape and sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize(("keywords", "spec"), CASES, ids=IDS)
def test_an_agent_from_a_spec_is_the_agent_from_its_keywords(keywords, spec):
    torch.manual_seed(3)
    by_keywords = keyword_agent(keywords)
    torch.manual_seed(3)
    by_spec = MemoryAgent(OBS, ACT, backbone=spec)
    assert by_keywords.backbone_spec == by_spec.backbone_spec == spec
    assert_same_weights(by_keywords, by_spec)
    if getattr(spec, "memory", 1) < 1:
        return  # a transformer acts through its memory's cache
    # the same acting from the same draws, through the built module
    obs, done = torch.randn(2, 5), torch.ones(2, dtype=torch.bool)
    outs = []
    for agent in (by_keywords, by_spec):
        torch.manual_seed(4)
        outs.append(agent.act(obs, agent.initial_state(2), done)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_agent_options_apply_to_an_agent_from_a_spec():
    torch.manual_seed(0)
    a = MemoryAgent(OBS, ACT, backbone="mlp", dim=16, layers=1, critic="separate")
    torch.manual_seed(0)
    b = MemoryAgent(OBS, ACT, backbone=MLPSpec(16, layers=1), critic="separate")
    assert_same_weights(a, b)
    ut = UniversalSpec(BlockConfig(16, 2), memory=4, max_steps=2)
    assert MemoryAgent(OBS, ACT, backbone=ut, tau=0.3).training_aux.keywords == {"tau": 0.3}
    with pytest.raises(ValueError, match="needs backbone 'mlp', not 'RNNSpec'"):
        MemoryAgent(OBS, ACT, backbone=RNNSpec(16), critic="separate")
    with pytest.raises(ValueError, match="only applies to backbone 'universal', not 'RNNSpec'"):
        MemoryAgent(OBS, ACT, backbone=RNNSpec(16), tau=0.1)


def test_keywords_that_contradict_the_spec_are_refused_naming_both():
    spec = StackSpec(BlockConfig(D, 4), memory=8, layers=2)
    agent = MemoryAgent(OBS, ACT, backbone=spec, dim=D, memory=8, gate="gru")  # they agree
    assert agent.backbone_spec is spec
    with pytest.raises(
        ValueError, match=r"StackSpec\(...\) conflicts with dim=64 \(the spec: dim=32"
    ):
        MemoryAgent(OBS, ACT, backbone=spec, dim=64)
    with pytest.raises(ValueError, match=r"heads=2 \(the spec: heads=4\), memory=16"):
        MemoryAgent(OBS, ACT, backbone=spec, heads=2, memory=16)
    with pytest.raises(ValueError, match=r"position='rotary' \(the spec: position='xl'\)"):
        MemoryAgent(OBS, ACT, backbone=spec, position="rotary")
    with pytest.raises(ValueError, match=r"options \['layers'\] do not apply to a UniversalSpec"):
        MemoryAgent(OBS, ACT, backbone=UniversalSpec(BlockConfig(D, 4), memory=8), layers=2)
    with pytest.raises(ValueError, match=r"options \['heads', 'position'\] do not apply to a RN"):
        MemoryAgent(OBS, ACT, backbone=RNNSpec(D), heads=4, position="xl")


def test_a_spec_of_another_model_is_refused():
    with pytest.raises(TypeError, match="backbone must be a name .* got CausalSpec"):
        MemoryAgent(OBS, ACT, backbone=CausalSpec(gpt2_config(D, 1)))


@pytest.mark.parametrize(
    "spec",
    [StackSpec(BlockConfig(D, 4, long_memory="linear"), memory=8, layers=1), RNNSpec(D, "gru")],
    ids=["stack", "gru"],
)
def test_an_agent_from_a_spec_copies_and_pickles_with_its_spec(spec):
    agent = MemoryAgent(OBS, ACT, backbone=spec)
    for twin in (copy.deepcopy(agent), pickle.loads(pickle.dumps(agent))):
        assert twin.backbone_spec == spec
        assert_same_weights(agent, twin)
        obs, done = torch.randn(3, 5), torch.ones(3, dtype=torch.bool)
        got, want = (
            a.act(obs, a.initial_state(3), done, deterministic=True)[0] for a in (twin, agent)
        )
        torch.testing.assert_close(got, want, rtol=0, atol=0)
