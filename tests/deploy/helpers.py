"""Tiny trained policies and the side-by-side run of an exported program against
``load_policy`` over whole episodes of a vector env."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

ort = pytest.importorskip(
    "onnxruntime", reason='the export tests need the export extra: pip install -e ".[export]"'
)

from rltrans.policy import Policy  # noqa: E402 - after the extra's check
from rltrans.train import main as train_main  # noqa: E402

TINY_RUN = [
    "env.num_envs=2",
    "algo.num_steps=8",
    "algo.segment_length=8",
    "algo.num_minibatches=1",
    "algo.epochs=1",
    "progress=false",
    "tensorboard=false",
    "total_steps=16",
]
SMALL_STACK = ["agent.dim=16", "agent.heads=2", "agent.memory=4"]
# Every online agent, small; gtrxl keeps its default long memory (mixed), trxl has the window only.
AGENTS = {
    "mlp": ["agent=mlp", "agent.dim=8"],
    "gru": ["agent=gru", "agent.dim=8"],
    "lstm": ["agent=lstm", "agent.dim=8"],
    "gtrxl": ["agent=gtrxl", *SMALL_STACK, "agent.layers=1", "agent.horizon=null"],
    "trxl": ["agent=trxl", *SMALL_STACK, "agent.layers=2", "agent.horizon=null"],
    "ut_act": ["agent=ut_act", *SMALL_STACK, "agent.max_steps=3"],
}
ATOL = 1e-5
# The key/value window: load_policy leaves an ended episode's keys in its ring buffer (masked
# from attention by the validity), the program zeroes them; both see only the valid slots.
WINDOW = ("next_state.keys", "next_state.values")
DISTRIBUTION = ("logits", "mean", "log_std")


def train_tiny(folder: Path, agent: str, env: str = "stateless_cartpole") -> Path:
    """A run of a few steps of ``agent`` on ``env`` (weights barely moved from their init)."""
    run = folder / f"run-{agent}"
    assert train_main([f"env={env}", *AGENTS[agent], *TINY_RUN, f"run_dir={run}"]) == 0
    return run


class Recorder:
    """What ``load_policy``'s agent computed in its last step, read by forward hooks on its
    public heads: the action distribution and the value (memory agents), the action head's
    predictions (DT/BC)."""

    def __init__(self, policy: Policy) -> None:
        agent, self.seen = policy.agent, {}
        for name in ("policy", "value", "action_codec"):
            module = getattr(agent, name, None)
            if isinstance(module, torch.nn.Module):
                module.register_forward_hook(lambda m, i, out, name=name: self._keep(name, out))

    def _keep(self, name: str, out: object) -> None:
        self.seen[name] = out

    def parameter(self, name: str) -> np.ndarray:
        """A parameter of the last step's action distribution, as the program names it:
        ``logits`` (log-probabilities of a categorical, logits of a Bernoulli), ``mean``,
        ``log_std`` (a Gaussian)."""
        if "policy" not in self.seen:  # DT/BC: the action head's logits at the newest step
            return torch.log_softmax(self.seen["action_codec"][:, -1], -1).numpy()
        dist = self.seen["policy"]
        if name == "logits":
            return getattr(dist, "log_p", getattr(dist, "logits", None)).numpy()
        return getattr(dist, name).detach().expand_as(dist.mean).numpy()

    def value(self) -> np.ndarray:
        """The last step's value estimates."""
        return self.seen["value"][..., 0].numpy()


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Floats within ATOL, everything else equal, shapes equal."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    if b.dtype.kind == "f":
        assert np.abs(a - b).max(initial=0.0) <= ATOL, (what, np.abs(a - b).max())
    else:
        assert (a == b).all(), what


def check_step(out: dict, action, recorder: Recorder, names: list[str], state) -> None:
    """One step's outputs of a program against the policy's: actions equal, logits and
    values within ATOL, the next memory equal to the policy's state (``state``: its tensors
    in the program's layout, named as ``names``)."""
    close(out["action"], action, "action")
    for name in DISTRIBUTION:
        if name in out:
            close(out[name], recorder.parameter(name), name)
    if "value" in out:
        close(out["value"], recorder.value(), "value")
    mine = dict(zip(names, state, strict=True))
    for name, tensor in mine.items():
        theirs, tensor = out[name], tensor.numpy()
        if name in WINDOW:  # slots outside the episode: stale in the ring, zero in the program
            seen = mine["next_state.valid"].numpy()[:, None, None, :, None]
            theirs, tensor = theirs * seen, tensor * seen
        close(theirs, tensor, name)


def onnx_runner(program: Path):
    """feeds -> outputs by name, through ONNX Runtime, for the program at ``program``."""
    meta = json.loads(Path(str(program) + ".json").read_text())
    session = ort.InferenceSession(str(program), providers=["CPUExecutionProvider"])
    names = [t["name"] for t in meta["outputs"]]
    return meta, lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))


def torch_runner(program: Path):
    """feeds -> outputs by name, through the ``torch.export`` archive at ``program``."""
    meta = json.loads(Path(str(program) + ".json").read_text())
    module = torch.export.load(str(program)).module()
    inputs, names = [t["name"] for t in meta["inputs"]], [t["name"] for t in meta["outputs"]]

    def run(feeds: dict) -> dict:
        with torch.no_grad():
            out = module(*(torch.from_numpy(np.asarray(feeds[k])) for k in inputs))
        return {name: t.numpy() for name, t in zip(names, out, strict=True)}

    return meta, run


def side_by_side(program, policy, envs, episodes: int, state_tensors, target=None, runner=None):
    """Run the exported program (``program``: its file; the sidecar beside it; ONNX Runtime
    unless ``runner`` says otherwise) and ``policy`` on the same observations until
    ``episodes`` episodes ended in every env, checking every step (:func:`check_step`)."""
    meta, run = (runner or onnx_runner)(program)
    n, recorder, names = envs.num_envs, Recorder(policy), _state_names(meta)
    feeds = {
        t["name"]: np.full((n, *t["shape"][1:]), t["initial"], t["dtype"])
        for t in meta["inputs"]
        if t["role"] == "state"
    }
    state = policy.initial_state(n) if target is None else policy.initial_state(n, target)
    obs, _ = envs.reset(seed=3)
    start, reward = np.ones(n, bool), np.zeros(n, np.float32)
    ends, steps, resets_alone = np.zeros(n, int), 0, 0
    while ends.min() < episodes:
        feeds |= {"obs": np.asarray(obs, np.float32), "episode_start": start}
        if target is not None:
            feeds |= {"reward": reward, "target_return": np.full(n, target, np.float32)}
        out = run(feeds)
        action, state = policy.act(np.asarray(obs, np.float32), state, start, reward=reward)
        check_step(out, action, recorder, names, state_tensors(state))
        feeds |= {t["pairs"]: out[t["name"]] for t in _state_outputs(meta)}
        obs, reward, term, trunc, _ = envs.step(action)
        reward = np.asarray(reward, np.float32)
        start = np.asarray(term) | np.asarray(trunc)
        resets_alone += int(0 < start.sum() < n)  # staggered: some envs reset, others go on
        ends += start
        steps += 1
    return {"steps": steps, "episodes": int(ends.sum()), "staggered_resets": resets_alone}


def _state_outputs(meta: dict) -> list[dict]:
    return [t for t in meta["outputs"] if t["role"] == "state"]


def _state_names(meta: dict) -> list[str]:
    return [t["name"] for t in _state_outputs(meta)]
