"""Memory agents' acting step as a pure program: observation, episode starts and the memory
in; action, distribution parameters, value and the next memory out.

The memory is the agent's acting state as named, batch-first tensors, by backbone:

* ``mlp``: none;
* ``lstm``: ``h`` and ``c`` (N, layers, D); ``gru``: ``h`` (N, layers, D);
* the transformer stacks (``gtrxl``, ``trxl``, ``trxl_i``) and the Universal Transformer:
  the key/value window of the last M steps, ``keys`` and ``values`` (N, Y, H, M, D/H), oldest
  first (Y: layers, or the Universal Transformer's depth steps), ``valid`` (N, M) (which
  slots hold a step of the current episode), ``time`` (N,) (steps since the episode began)
  and the long memory's tensors (``long.<field>``, (N, Y, ...); none with long_memory=none).

The acting state of ``load_policy`` holds the window in a ring buffer of 2M slots written in
place (:class:`rltrans.memory.MemoryState`); the program steps the agent through its public
acting call on a state with the same calls over a window that shifts by one step
(:class:`ShiftingWindow`), so the math is the library's own and only the layout is the
program's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rltrans.backbones.rnn import RNNState
from rltrans.deploy import ExportError
from rltrans.deploy.tensors import ActionOutputs, action_outputs, reset_rows
from rltrans.memory import MemoryState
from rltrans.spaces import obs_to_tensor
from rltrans.types import Tree


class ObservationInputs:
    """An observation space's leaves as inputs: ``obs`` for a Box/Discrete/MultiDiscrete/
    MultiBinary space, ``obs.<key>`` (Dict) and ``obs.<index>`` (Tuple) for containers."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.paths = list(_leaf_paths(space, ()))
        self.names = ["obs" + "".join(f".{p}" for p in path) for path in self.paths]

    def tree(self, leaves: tuple[Tensor, ...]) -> Tree:
        """The observation tree the agent takes, from the inputs in order."""
        return _rebuild(self.space, iter(leaves))

    def example(self, n: int, seed: int = 0) -> tuple[Tensor, ...]:
        """n sampled observations, as the leaves ``load_policy`` passes the agent."""
        self.space.seed(seed)
        samples = [self.space.sample() for _ in range(n)]
        batch = _stack(self.space, samples)
        return tuple(_leaves(obs_to_tensor(batch, self.space)))


def _leaf_paths(space: gym.Space, prefix: tuple) -> Any:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _leaf_paths(sub, (*prefix, key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _leaf_paths(sub, (*prefix, i))
    else:
        yield prefix


def _rebuild(space: gym.Space, leaves: Any) -> Tree:
    if isinstance(space, gym.spaces.Dict):
        return {key: _rebuild(sub, leaves) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_rebuild(sub, leaves) for sub in space.spaces)
    return next(leaves)


def _stack(space: gym.Space, samples: list) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _stack(sub, [s[k] for s in samples]) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stack(sub, [s[i] for s in samples]) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(s) for s in samples])


def _leaves(tree: Tree) -> Any:
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, tuple):
        for value in tree:
            yield from _leaves(value)
    else:
        yield tree


class NoMemory:
    """The memoryless MLP: no state tensors."""

    names: tuple[str, ...] = ()
    docs: tuple[str, ...] = ()

    def tensors(self, state: Any) -> tuple[Tensor, ...]:
        """The exported tensors of an acting state."""
        return ()

    def state(self, tensors: tuple[Tensor, ...]) -> Any:
        """The acting state of exported tensors."""
        return ()


class RecurrentMemory:
    """An LSTM's (h, c) or a GRU's h, (N, layers, D) each (a GRU's c is always zero)."""

    def __init__(self, lstm: bool) -> None:
        self.lstm = lstm
        self.names = ("h", "c") if lstm else ("h",)
        docs = ("hidden state h of each layer", "cell state c of each layer")
        self.docs = docs if lstm else docs[:1]

    def tensors(self, state: RNNState) -> tuple[Tensor, ...]:
        """The exported tensors of an acting state."""
        return (state.h, state.c) if self.lstm else (state.h,)

    def state(self, tensors: tuple[Tensor, ...]) -> RNNState:
        """The acting state of exported tensors."""
        h = tensors[0]
        return RNNState(h, tensors[1] if self.lstm else torch.zeros_like(h))


class ShiftingWindow:
    """The acting state a transformer backbone steps through inside an exported program: the
    calls of :class:`rltrans.memory.MemoryState` that a step makes (``step_mask``,
    ``windows``, ``store``, ``advance``), on a window of exactly M steps that each step
    shifts by one, without writes into a buffer (ONNX Runtime copies a whole tensor for every
    indexed write: a Universal Transformer's step at 16 envs took about 5x as long that way).

    keys, values: (Y, N, H, M, D/H) oldest first; valid (N, M); time (N,); long: layer-first.
    """

    def __init__(self, keys, values, valid, time, contexts, long) -> None:
        self.keys, self.values, self.valid, self.time = keys, values, valid, time
        self.contexts, self.long = contexts, long
        self.new: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> this step's key, value

    def step_mask(self, dtype: torch.dtype) -> Tensor:
        """(N, 1, M+1) additive mask, as ``MemoryState.step_mask``: -inf over the window's
        slots outside the episode, 0 elsewhere and on the step itself."""
        hidden = torch.zeros(self.valid.shape, dtype=dtype, device=self.valid.device)
        window = hidden.masked_fill(~self.valid, float("-inf"))  # (N, M)
        return torch.cat([window, hidden[:, :1]], dim=1).unsqueeze(1)

    def windows(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values of the last M steps, (Y, N, H, M, D/H) each."""
        return self.keys, self.values

    def store(self, layers: int | slice, hidden: Tensor, key: Tensor, value: Tensor) -> None:
        """Keep this step's keys and values of one layer (N, H, D/H) or of all (Y, N, H,
        D/H); the layer inputs only serve a refresh after a weight change: dropped."""
        if isinstance(layers, slice):
            self.new |= {i: (k, v) for i, (k, v) in enumerate(zip(key, value, strict=True))}
        else:
            self.new[layers] = (key, value)

    def advance(self) -> ShiftingWindow:
        """The window after the step: its oldest step dropped, this one appended."""
        keys, values = (torch.stack([self.new[i][j] for i in sorted(self.new)]) for j in (0, 1))
        shift = lambda old, new: torch.cat([old[:, :, :, 1:], new.unsqueeze(3)], dim=3)  # noqa: E731
        valid = torch.cat([self.valid[:, 1:], torch.ones_like(self.valid[:, :1])], dim=1)
        return ShiftingWindow(
            shift(self.keys, keys),
            shift(self.values, values),
            valid,
            self.time + 1,
            self.contexts,
            self.long,
        )


class WindowMemory:
    """A transformer's window of M steps (and its long memory), batch-first; see the module
    docstring. ``contexts`` are the acting state's per-step constants (derived from the
    weights when the state is made); ``long_fields`` name the long memory's tensors."""

    def __init__(self, contexts: tuple[Any, ...], long_fields: tuple[str, ...]) -> None:
        self.contexts = contexts
        self.names = ("keys", "values", "valid", "time", *(f"long.{f}" for f in long_fields))
        self.docs = (
            "cached attention keys of the last M steps per layer, oldest first",
            "cached attention values of the last M steps per layer, oldest first",
            "true where a window slot holds a step of the current episode",
            "steps since the episode began",
            *(f"long-memory state {f!r} of each layer" for f in long_fields),
        )

    def tensors(self, state: MemoryState | ShiftingWindow) -> tuple[Tensor, ...]:
        """The window (oldest step first) of an acting state, batch-first: of
        ``load_policy``'s ring buffer (:class:`MemoryState`) or of the program's own."""
        keys, values, valid = state.keys, state.values, state.valid
        if isinstance(state, MemoryState):
            w = state.window()
            keys, values, valid = keys[:, :, :, w], values[:, :, :, w], valid[:, w]
        long = tuple(t.transpose(0, 1) for t in state.long)  # (N, Y, ...)
        return keys.transpose(0, 1), values.transpose(0, 1), valid, state.time, *long

    def state(self, tensors: tuple[Tensor, ...]) -> ShiftingWindow:
        """The program's acting state holding ``tensors``."""
        keys, values, valid, time, *long = tensors
        long = tuple(t.transpose(0, 1).clone() for t in long)  # a stack's step copies into them
        layer_first = keys.transpose(0, 1), values.transpose(0, 1)  # (Y, N, H, M, D/H)
        return ShiftingWindow(*layer_first, valid, time, self.contexts, long)


Memory = NoMemory | RecurrentMemory | WindowMemory


def memory_layout(agent: nn.Module) -> Memory:
    """The exported layout of a memory agent's acting state, read from a fresh state."""
    fresh = agent.initial_state(1)
    if isinstance(fresh, tuple) and not fresh:
        return NoMemory()
    if isinstance(fresh, RNNState):
        return RecurrentMemory(lstm=getattr(agent.backbone, "cell", "lstm") == "lstm")
    if isinstance(fresh, MemoryState):
        return WindowMemory(fresh.contexts, _long_fields(agent, len(fresh.long)))
    raise ExportError(f"the acting state {type(fresh).__name__} has no exported layout")


def _long_fields(agent: nn.Module, count: int) -> tuple[str, ...]:
    """Names of the long memory's tensors: its state's field names (``S``, ``z``; the
    compressive memory's ``keys``, ``values``, ...), else their indices."""
    blocks = getattr(agent.backbone, "blocks", None) or [None]
    state = getattr(getattr(blocks[0], "long", None), "State", None)
    fields = tuple(getattr(state, "_fields", ()))
    return fields if len(fields) == count else tuple(str(i) for i in range(count))


class MemoryProgram(nn.Module):
    """One acting step of a memory agent with flat tensor inputs and outputs.

    Inputs: the observation leaves, ``episode_start`` (N,) bool, ``noise`` (when sampling),
    the memory tensors. Outputs: ``action``, the distribution's parameters, ``value`` (when
    asked), the next memory tensors.
    """

    def __init__(self, agent: nn.Module, *, sample: bool, value: bool) -> None:
        super().__init__()
        self.agent = agent
        self.observation = ObservationInputs(agent.observation_space)
        self.memory = memory_layout(agent)
        self.outputs: ActionOutputs = action_outputs(agent.policy)
        self.sample, self.value = sample, value

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        """One step (see the class docstring for the order)."""
        k = len(self.observation.names)
        obs = self.observation.tree(inputs[:k])
        keep = ~inputs[k].bool()  # (N,) false where an episode starts
        rest = inputs[k + 1 :]
        noise, rest = (rest[0], rest[1:]) if self.sample else (None, rest)
        state = self.memory.state(tuple(reset_rows(t, keep) for t in rest))
        dist, value, state = self.agent.act_distribution(obs, state, None)
        action = self.outputs.sample(dist, noise) if self.sample else dist.mode()
        out = (self.agent.policy.env_action_tensor(action), *self.outputs.parameters(dist))
        if self.value:
            out += (value,)
        return (*out, *self.memory.tensors(state))
