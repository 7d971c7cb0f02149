"""Exported programs of agents built here (no training run): observation encoders (Discrete
lookups, Dict and Tuple containers, uint8 images) and long memories inside the program, any
batch size, sampling from a noise input, and one-line errors for what cannot be exported."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.agents.dt import build_decision_transformer
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.deploy import ExportError
from rltrans.deploy.memory import ObservationInputs
from rltrans.deploy.write import acting_program, onnx_bytes, trace
from rltrans.policy import Policy
from tests.deploy.helpers import Recorder, check_step, ort

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
SPACES = {
    "dict": gym.spaces.Dict({"cell": gym.spaces.Discrete(5, start=2), "frame": IMAGE, "v": BOX}),
    "tuple": gym.spaces.Tuple((gym.spaces.MultiDiscrete([3, 4]), BOX)),
    "discrete": gym.spaces.Discrete(6),
}
STACK = {"dim": 16, "heads": 2, "memory": 4}


def session(policy: Policy, **options):
    """The policy's program, its ONNX Runtime session and output names."""
    program = acting_program(policy, **options)
    data = onnx_bytes(trace(program, "test policy"), program, "test policy")
    runtime = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return program, runtime


def run_random_steps(policy: Policy, n: int, steps: int = 20) -> None:
    """ONNX Runtime and ``policy`` on random observations with random episode starts."""
    program, runtime = session(policy, value=True)
    inputs = [s.name for s in program.inputs]
    outputs = [s.name for s in program.outputs]
    state_names = [s.name for s in program.outputs if s.role == "state"]
    observation = ObservationInputs(policy.observation_space)
    recorder, rng = Recorder(policy), np.random.default_rng(0)
    state = policy.initial_state(n)
    feeds = {s.name: np.zeros((n, *s.shape[1:]), s.dtype) for s in program.inputs}
    for step in range(steps):
        leaves = observation.example(n, seed=step)
        start = rng.random(n) < 0.25
        feeds |= {name: t.numpy() for name, t in zip(observation.names, leaves, strict=True)}
        feeds["episode_start"] = start
        out = dict(zip(outputs, runtime.run(outputs, {k: feeds[k] for k in inputs}), strict=True))
        obs = observation.tree(leaves)
        action, state = policy.act(obs, state, torch.from_numpy(start))
        action = np.asarray(action)  # NumPy for container observations, torch otherwise
        check_step(out, action, recorder, state_names, program.state_tensors(state))
        for spec in program.outputs:
            if spec.role == "state":
                feeds[spec.pairs] = out[spec.name]


@pytest.mark.parametrize("space", sorted(SPACES))
def test_observation_encoders_are_inside_the_program(space):
    agent = MemoryAgent(SPACES[space], gym.spaces.Discrete(3), backbone="gru", dim=16)
    run_random_steps(Policy(agent.eval(), {}), n=3)


@pytest.mark.parametrize("long_memory", ["compressive", "linear"])
def test_long_memories_are_carried_through_the_program(long_memory):
    kw = {"compressed_slots": 2, "compression_rate": 2} if long_memory == "compressive" else {}
    agent = MemoryAgent(
        BOX, gym.spaces.Discrete(3), layers=1, long_memory=long_memory, **STACK, **kw
    )
    run_random_steps(Policy(agent.eval(), {}), n=3)


def test_one_program_runs_any_batch_and_a_gaussian_head():
    agent = MemoryAgent(BOX, gym.spaces.Box(-0.5, 0.5, (2,)), backbone="gtrxl", layers=1, **STACK)
    policy = Policy(agent.eval(), {})
    for n in (1, 5):
        run_random_steps(policy, n=n, steps=6)


def test_sampling_draws_from_the_noise_input():
    agent = MemoryAgent(BOX, gym.spaces.Discrete(4), backbone="lstm", dim=8).eval()
    program, runtime = session(Policy(agent, {}), sample=True)
    noise = next(s for s in program.inputs if s.role == "noise")
    assert noise.extra == {"distribution": "uniform"} and noise.shape == ("batch", 4)
    feeds = {s.name: t.numpy() for s, t in zip(program.inputs, program.example, strict=True)}
    draws = []
    for seed in range(200):
        feeds["noise"] = np.random.default_rng(seed).random((2, 4), dtype=np.float32)
        action, logits = runtime.run(["action", "logits"], feeds)[:2]
        gumbel = -np.log(-np.log(feeds["noise"]))
        assert (action == np.argmax(logits + gumbel, -1)).all()
        draws.append(action[0])
    # A near-uniform initial policy: every action is drawn, about a quarter of the time each.
    counts = np.bincount(draws, minlength=4)
    assert counts.min() > 20, counts


def test_what_cannot_be_exported_is_named_in_one_line():
    dt = build_decision_transformer(BOX, gym.spaces.Box(-1, 1, (2,)), dim=16, layers=1)
    policy = Policy(dt.eval(), {}, return_conditioned=True, target_return=1.0)
    with pytest.raises(ExportError, match=r"^value=true: DecisionTransformer has no value head"):
        acting_program(policy, value=True)
    with pytest.raises(ExportError, match=r"^sample=true: this policy's Box actions are a point"):
        acting_program(policy, sample=True)

    class Scripted(torch.nn.Module):
        observation_space, action_space = BOX, gym.spaces.Discrete(2)

    with pytest.raises(ExportError, match=r"^Scripted cannot be exported: rltrans exports") as err:
        acting_program(Policy(Scripted(), {}))
    assert "\n" not in str(err.value)
