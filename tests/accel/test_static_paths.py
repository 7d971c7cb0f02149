"""The models never ask whether they are compiled: rltrans.accel switches their static path
on (``static_graph``) while its compiled programs run, and off after."""

import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import rltrans.accel.compile as compile_module
from rltrans.accel.static import static_modules, static_paths
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.backbones.rnn import RNNBackbone
from rltrans.core.position import XLAttention

ROOT = Path(__file__).resolve().parents[2] / "rltrans"
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(3)


def test_no_model_asks_whether_it_is_compiled():
    for folder in ("core", "backbones"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "is_compiling" not in path.read_text(), path


def test_static_paths_are_on_inside_and_off_after_also_nested_and_across_threads():
    agent = MemoryAgent(OBS, ACT, backbone="gtrxl", dim=16, layers=2, heads=2, memory=4)
    modules = static_modules(agent)
    assert agent.backbone in modules
    assert sum(isinstance(m, XLAttention) for m in modules) == 2  # one per layer
    assert not any(m.static_graph for m in modules)
    entered, release = threading.Event(), threading.Event()

    def other_thread() -> None:
        with static_paths(modules):
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=other_thread)
    with static_paths(modules):
        worker.start()
        entered.wait(10)
        with static_paths(modules):
            assert all(m.static_graph for m in modules)
        assert all(m.static_graph for m in modules)
    assert all(m.static_graph for m in modules)  # the other thread is still inside
    release.set()
    worker.join(10)
    assert not any(m.static_graph for m in modules)
    assert all("static_graph" not in vars(m) for m in modules)  # the class's False again


def test_a_compiled_method_runs_its_models_static_path(monkeypatch):
    """compiled() wraps torch.compile's program so the owner's flags are on while it runs
    (torch.compile replaced by a recorder: no compilation here)."""
    agent = MemoryAgent(OBS, ACT, backbone="gru", dim=8, layers=1)
    seen = []
    monkeypatch.setattr(
        compile_module.torch, "compile", lambda fn, **_: lambda *a: seen.append(fn(*a))
    )
    program = compile_module.compiled(lambda: agent.backbone.static_graph, owner=agent)
    program()
    assert seen == [True] and agent.backbone.static_graph is False


def test_the_recurrent_static_path_equals_its_shortcut():
    """Without episode starts the eager shortcut runs the segment in one fused call; the
    static path steps it, zeroing nothing: the same outputs."""
    torch.manual_seed(0)
    rnn = RNNBackbone(8, layers=2, cell="gru")
    x, starts = torch.randn(3, 5, 8), torch.zeros(3, 5, dtype=torch.bool)
    fused = rnn(x, starts=starts)
    with static_paths(static_modules(rnn)):
        stepped = rnn(x, starts=starts)
    torch.testing.assert_close(stepped.hidden, fused.hidden, rtol=1e-5, atol=1e-6)
