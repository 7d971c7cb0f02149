"""A resolved config frozen into plain data: reads like the composed one, refuses every
change, and thaws back to exactly the data it was made from."""

from __future__ import annotations

import copy
import pickle

import pytest

import rltrans
from rltrans.config import load_config, to_container
from rltrans.config.frozen import Frozen, freeze, thaw
from rltrans.config.plan import AgentSection, EnvSection

DATA = {"env": {"kind": "gym", "kwargs": {"a": [1, {"b": 2}]}, "wrappers": []}, "seed": 1}


def test_freeze_then_thaw_gives_back_the_same_plain_data():
    frozen = freeze(DATA)
    assert isinstance(frozen, Frozen) and isinstance(frozen.env.kwargs, Frozen)
    assert frozen.env.kwargs.a == (1, Frozen({"b": 2})) and frozen.env.wrappers == ()
    back = thaw(frozen)
    assert back == DATA and type(back["env"]["kwargs"]["a"]) is list
    back["env"]["kind"] = "torch"  # a copy: the frozen one is untouched
    assert frozen.env.kind == "gym" and frozen == DATA  # equal to any mapping of its items


@pytest.mark.parametrize(
    "change",
    [
        lambda f: setattr(f, "seed", 2),
        lambda f: setattr(f.env, "kind", "torch"),
        lambda f: delattr(f, "seed"),
        lambda f: f.__setitem__("seed", 2),
        lambda f: f.env.kwargs.a[1].__setitem__("b", 3),
        lambda f: f.env.kwargs.a.append(3),
    ],
)
def test_every_change_is_refused_at_every_depth(change):
    frozen = freeze(DATA)
    with pytest.raises((TypeError, AttributeError)):
        change(frozen)
    assert thaw(frozen) == DATA


def test_a_missing_key_names_the_keys_there_are():
    with pytest.raises(AttributeError, match=r"no key 'sed'; its keys: env, seed"):
        getattr(freeze(DATA), "sed")  # noqa: B009  (the attribute read is the test)
    assert freeze(DATA).get("sed") is None


def test_it_pickles_and_copies_as_plain_data_and_replace_makes_a_new_one():
    frozen = freeze(DATA)
    for other in (pickle.loads(pickle.dumps(frozen)), copy.deepcopy(frozen)):
        assert isinstance(other, Frozen) and thaw(other) == DATA
    moved = frozen.replace(run_dir="runs/x")
    assert moved.run_dir == "runs/x" and "run_dir" not in frozen


def test_a_plan_holds_the_composed_config_frozen_with_its_sections_typed():
    overrides = ["env=gym", "env.id=CartPole-v1", "agent=gru", "total_steps=64"]
    plan = rltrans.plan(*overrides)
    composed = to_container(load_config(overrides))
    assert plan.to_dict()["env"] == composed["env"] and plan.to_dict()["agent"]["backbone"] == "gru"
    assert plan.env == EnvSection("gym", composed["env"]["num_envs"], plan.config.env)
    assert plan.env.label == "CartPole-v1" and plan.agent.label == "gru"
    assert plan.agent == AgentSection(composed["agent"]["kind"], "gru", plan.config.agent)
    assert plan.env.to_dict(num_envs=2) == {**composed["env"], "num_envs": 2}
    assert rltrans.plan("env=tmaze").env.label == "tmaze"  # a torch task by its name
