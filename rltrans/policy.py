"""Saved policies for use from Python: ``rltrans.load_policy(path)``.

>>> policy = load_policy("runs/my-run")                           # doctest: +SKIP
>>> state = policy.initial_state(1)                              # doctest: +SKIP
>>> action, state = policy.act(obs, state)                       # doctest: +SKIP

Observations may be one observation (no batch axis; the action comes back without one too,
as Stable-Baselines3's ``predict``) or a batch (N, ...); NumPy in, NumPy out; torch in,
torch out. Return-conditioned policies (agent=dt|bc, trained offline) take the return to aim
for and count the rewards they receive down from it (Chen et al. 2021, Algorithm 1):

>>> dt = load_policy("runs/dt-run")                              # doctest: +SKIP
>>> state = dt.initial_state(1, target_return=500.0)             # doctest: +SKIP
>>> action, state = dt.act(obs, state, done)                     # doctest: +SKIP
>>> state = dt.observe(state, reward)                            # doctest: +SKIP

Loading builds the agent through :mod:`rltrans.registry` from the checkpoint's plain config
and loads its tensors with ``torch.load(weights_only=True)``: nothing in the file is imported
or called.
"""

from __future__ import annotations

import math
import os
import reprlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rltrans.accel.threads import AUTO, ThreadTuner, tuned
from rltrans.config import ConfigError, checked_file_config, refuse_env_code, to_container
from rltrans.config.keys import MAX_LENGTH, THREADS
from rltrans.config.resources import weights_problem
from rltrans.config.spec import DEVICE, bad_value
from rltrans.registry import (
    AgentEntry,
    RegistryError,
    agent_entry,
    algo_agent_options,
    build_agent,
)
from rltrans.run.checkpoint import CheckpointError, check_finite_weights, load_checkpoint
from rltrans.run.context import payload_spaces, select_device, set_threads
from rltrans.spaces import obs_to_tensor
from rltrans.types import Tree, tree_leaves


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory / checkpoints directory -> its last.pt."""
    path = Path(path)
    for candidate in (path, path / "last.pt", path / "checkpoints" / "last.pt"):
        if candidate.is_file():
            return candidate
        if os.path.lexists(candidate) and not candidate.is_dir():
            return candidate  # a link or a special file: load_checkpoint says which, unopened
    raise FileNotFoundError(
        f"no checkpoint at {path} (looked for the file itself, {path / 'last.pt'} and "
        f"{path / 'checkpoints' / 'last.pt'})"
    )


def check_payload(payload: dict[str, Any], source: str = "checkpoint") -> None:
    """The trust boundary for a loaded checkpoint: its config (and the env an offline run
    resolved to) checked as a command line would be, with the defaults of keys an older
    rltrans did not write, put back in place; the build arguments that are not config knobs
    checked for type and size. Raises ConfigError or CheckpointError naming the key."""
    if "_target_" in payload:
        raise CheckpointError(f"{source}: _target_ at the top: a checkpoint may not name code")
    if "config" not in payload:
        raise CheckpointError(f"{source} lacks 'config'; it was not written by rltrans.train")
    try:
        config = to_container(checked_file_config(payload["config"], source))
        if payload.get("eval_env") is not None:
            both = checked_file_config({**config, "env": payload["eval_env"]}, f"{source} eval_env")
            payload["eval_env"] = to_container(both.env)
    except ConfigError as err:
        raise CheckpointError(str(err)) from None
    payload["config"] = config
    extra = payload.get("agent_kwargs") or {}
    stats = extra.get("stats") if isinstance(extra, dict) else None
    if not isinstance(extra, dict) or set(extra) - {"stats"} or not isinstance(stats, dict | None):
        raise CheckpointError(f"{source}: agent_kwargs must be {{stats: {{...}}}}, not {extra!r}")
    longest = (stats or {}).get("max_timestep", 1)
    if not isinstance(longest, int) or not 1 <= longest <= MAX_LENGTH:
        raise CheckpointError(
            f"{source}: agent_kwargs.stats.max_timestep={longest!r}: expected an integer in "
            f"[1, {MAX_LENGTH}]"
        )
    _check_offline_fields(payload, source)
    check_finite_weights(payload.get("model"), source)


MAX_TARGETS = 4096  # evaluation targets an offline checkpoint may record
# What an offline checkpoint's "dataset" description holds, by field: (type, finite number).
_DATASET_FIELDS = {
    "id": str,
    "kind": str,
    "episodes": int,
    "steps": int,
    "min_return": float,
    "mean_return": float,
    "max_return": float,
    "ref_min_score": float,  # D4RL-style data's reference returns (optional)
    "ref_max_score": float,
}


def _number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value)


def _check_offline_fields(payload: dict[str, Any], source: str) -> None:
    """``eval_targets`` (finite numbers) and ``dataset`` (the description the offline trainer
    writes) as an offline checkpoint holds them; CheckpointError naming the field otherwise."""
    targets = payload.get("eval_targets")
    if targets is not None and not (
        isinstance(targets, list) and len(targets) <= MAX_TARGETS and all(map(_number, targets))
    ):
        raise CheckpointError(
            f"{source}: eval_targets={reprlib.repr(targets)}: expected a list of at most "
            f"{MAX_TARGETS} finite numbers"
        )
    dataset = payload.get("dataset")
    if dataset is None:
        return
    if not isinstance(dataset, dict):
        raise CheckpointError(
            f"{source}: dataset={reprlib.repr(dataset)}: expected a mapping with "
            f"{', '.join(_DATASET_FIELDS)}"
        )
    for name, value in dataset.items():
        kind = _DATASET_FIELDS.get(name)
        ok = kind is not None and (
            (kind is str and isinstance(value, str) and len(value) <= 1024)
            or (
                kind is int
                and isinstance(value, int)
                and not isinstance(value, bool)
                and value >= 0
            )
            or (kind is float and _number(value))
        )
        if not ok:
            valid = ", ".join(f"{k} ({t.__name__})" for k, t in _DATASET_FIELDS.items())
            raise CheckpointError(
                f"{source}: dataset.{name}={reprlib.repr(value)}: not a valid field; valid: {valid}"
            )


def agent_from_checkpoint(
    payload: dict[str, Any], device: torch.device | str = "cpu", source: str = "checkpoint"
) -> tuple[torch.nn.Module, AgentEntry]:
    """Rebuild the agent a loaded checkpoint describes (in eval mode), and its registry entry,
    after :func:`check_payload` (nothing is allocated for a config that fails it)."""
    check_payload(payload, source)
    try:
        agent_cfg = payload["config"]["agent"]
        state_dict = payload["model"]
        entry = agent_entry(agent_cfg)
        # Build arguments that are not config knobs, e.g. DT's dataset statistics (whose
        # max_timestep sizes the timestep embedding): saved by the trainer as "agent_kwargs".
        extra = payload.get("agent_kwargs") or {}
        # ... and the agent's parts that the algo section adds (algo.reconstruction_coef: the
        # decoder, whose weights the checkpoint holds; absent in older checkpoints = 0).
        extra = {**extra, **algo_agent_options(agent_cfg, payload["config"].get("algo"))}
        spaces = payload_spaces(payload)
        # Spaces sized beyond the weights in the file: refused before the build allocates them.
        tensors = state_dict.values() if isinstance(state_dict, dict) else ()
        held = sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))
        if problem := weights_problem(payload["config"], spaces, held):
            raise CheckpointError(f"{source}: {problem}")
        agent = build_agent(agent_cfg, *spaces, **extra)
    except KeyError as err:
        raise CheckpointError(
            f"{source} lacks {err}; it was not written by rltrans.train"
        ) from None
    except RegistryError as err:
        raise CheckpointError(f"{source} config: {err}") from None
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{source}: its config builds no agent ({err})") from None
    try:
        agent.load_state_dict(state_dict)
    except (RuntimeError, TypeError, AttributeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{source}: its weights do not fit its config ({first})") from None
    return agent.to(device).eval(), entry


def check_env_code(env_cfg: Any, trust: bool, source: str = "the checkpoint's env config") -> None:
    """Refuse an env config read from a file that would import or call code outside
    gymnasium, ale-py, minigrid and rltrans unless ``trust`` (:func:`refuse_env_code`)."""
    refuse_env_code(env_cfg, source, trust)


def _as_batch(obs: Any, space: gym.Space) -> tuple[Any, bool]:
    """(obs with a batch axis, whether one was added); names the space on a shape mismatch."""
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
        return obs, False  # containers: batched as given
    shape = tuple(obs.shape) if hasattr(obs, "shape") else np.shape(obs)
    if shape == space.shape:
        return obs[None], True
    if shape[1:] != space.shape:
        raise ValueError(
            f"observation of shape {shape} does not fit the policy's observation space {space}: "
            f"pass one observation of shape {space.shape} or a batch (N, *{space.shape})"
        )
    return obs, False


class Policy:
    """A trained agent behind a NumPy-or-torch acting API with explicit per-env state.

    ``deterministic`` defaults to the mode action (memory policies) or to the training run's
    ``algo.eval_deterministic`` (return-conditioned ones; DT's Atari code samples).
    ``target_return`` (return-conditioned policies) defaults to the largest target the
    training run evaluated, else the best return in its dataset.
    """

    def __init__(
        self,
        agent: torch.nn.Module,
        config: dict[str, Any],
        *,
        return_conditioned: bool = False,
        target_return: float | None = None,
    ) -> None:
        self.agent, self.config = agent, config
        self.observation_space = agent.observation_space
        self.action_space = agent.action_space
        self.return_conditioned = return_conditioned
        self.target_return = target_return
        default = config.get("algo", {}).get("eval_deterministic", False)
        self.deterministic = bool(default) if return_conditioned else True
        self.threads: ThreadTuner | None = None  # torch_threads=auto (load_policy sets it)

    @property
    def device(self) -> torch.device:
        """Device of the agent's parameters."""
        return next(self.agent.parameters()).device

    def initial_state(self, num_envs: int, target_return: Any = None) -> Tree:
        """Fresh state for ``num_envs`` envs; a return-conditioned policy aims at
        ``target_return`` (one value or one per env)."""
        if not self.return_conditioned:
            if target_return is not None:
                raise ValueError("target_return applies to return-conditioned policies (DT/BC)")
            return self.agent.initial_state(num_envs)
        target = self.target_return if target_return is None else target_return
        if target is None:
            raise ValueError(
                "this checkpoint records no default target return; pass "
                "initial_state(n, target_return=<the return to aim for>)"
            )
        if not isinstance(target, torch.Tensor):
            target = np.asarray(target, dtype=np.float32)
        return self.agent.initial_state(num_envs, torch.as_tensor(target, device=self.device))

    def act(
        self,
        obs: Any,
        state: Tree,
        done: Any = None,
        *,
        reward: Any = None,
        deterministic: bool | None = None,
    ) -> tuple[Any, Tree]:
        """Actions in the env's format for one observation or a batch (N, ...).

        ``done`` (N,) marks envs whose episode starts at ``obs`` (default: none); ``reward``
        (N,), if given, is the previous step's reward (same as calling :meth:`observe`).
        """
        as_numpy = not isinstance(obs, torch.Tensor)
        obs, single = _as_batch(obs, self.observation_space)
        if reward is not None:
            state = self.observe(state, np.atleast_1d(reward) if as_numpy else reward)
        x = obs_to_tensor(obs, self.observation_space, self.device)
        n = tree_leaves(x)[0].shape[0]
        if done is None:
            done = torch.zeros(n, dtype=torch.bool, device=self.device)
        done = torch.as_tensor(np.atleast_1d(done) if as_numpy else done, device=self.device)
        mode = self.deterministic if deterministic is None else deterministic
        with tuned(self.threads):
            out, state = self.agent.act(x, state, done.bool().view(n), deterministic=mode)
        action = out.env_action[0] if single else out.env_action
        if as_numpy:
            array = action.cpu().numpy()
            action = array.astype(self.action_space.dtype, copy=False)
        return action, state

    def observe(self, state: Tree, reward: Any) -> Tree:
        """Fold in the rewards (N,) of the last step (a return-to-go counts them down)."""
        if not isinstance(reward, torch.Tensor):
            reward = np.atleast_1d(np.asarray(reward, dtype=np.float32))
        return self.agent.observe(state, torch.as_tensor(reward, device=self.device))


# What load_policy takes as torch_threads: the command line's values, and None (leave it).
POLICY_THREADS = replace(THREADS, words=(AUTO,), nullable=True)


def policy_device(device: torch.device | str, torch_threads: Any) -> torch.device:
    """The device ``load_policy`` loads onto, after checking ``device`` and ``torch_threads``
    as the command line does; ConfigError naming the argument and what is valid."""
    ok, _ = POLICY_THREADS.check(torch_threads)
    if not ok or isinstance(torch_threads, bool):
        raise ConfigError(bad_value("torch_threads", torch_threads, POLICY_THREADS))
    name = str(device) if isinstance(device, torch.device) else device
    if not DEVICE.check(name)[0]:
        raise ConfigError(bad_value("device", name, DEVICE))
    return select_device(name)


def load_policy(
    path: str | Path, device: torch.device | str = "cpu", torch_threads: int | str | None = AUTO
) -> Policy:
    """Load a saved rltrans policy (checkpoint file or run directory) for acting.

    ``device`` as ``rltrans.evaluate`` takes it (``auto``, ``cpu``, ``cuda``, ``cuda:<index>``).
    ``torch_threads`` sets torch's intra-op threads as training does: ``auto`` (on CPU)
    times the first ``act`` calls at 1, 2, 4, ... threads and keeps the fewest within 10 %
    of the fastest (``policy.threads.chosen``); an integer in [0, 1024] fixes it (0: torch's
    default); None leaves torch's setting alone. A bad ``device`` or ``torch_threads`` (or a
    CUDA device this machine lacks) raises ConfigError naming it, before the file is read.
    """
    device = policy_device(device, torch_threads)
    if torch_threads is not None:
        set_threads(torch_threads)
    file = resolve_checkpoint(path)
    payload = load_checkpoint(file, map_location=device)
    agent, entry = agent_from_checkpoint(payload, device, source=f"checkpoint {file}")
    targets = payload.get("eval_targets") or []
    best = (payload.get("dataset") or {}).get("max_return")
    policy = Policy(
        agent,
        payload["config"],
        return_conditioned=entry.return_conditioned,
        target_return=max(targets) if targets else best,
    )
    if torch_threads == AUTO and device.type == "cpu":
        policy.threads = ThreadTuner("acting step")
    return policy
