"""python -m rltrans.collect dataset_id=<namespace/name-vN> episodes=N [policy=...] [key=value ...]

Writes a Minari dataset (hdf5, no jax) of episodes played by

* ``policy=random``: uniform random actions (``env_id=`` required);
* ``policy=<checkpoint file or run dir>``: a saved rltrans policy (``rltrans.load_policy``),
  in its training env unless ``env_id=`` names another with the same spaces;
* ``policy=<module:attr>``: a Python policy with ``initial_state(n)`` and
  ``act(obs, state, done)`` (a class or factory is called without arguments), e.g.
  ``rltrans.envs.scripted:CartPoleController``;

mixed with random actions by ``epsilon=0.3`` (per step), or ``epsilon=[0,1]`` to split the
episodes evenly over several values (a mixed-quality dataset). Prints one JSON line: dataset
id, path, episodes, steps and mean/min/max return. Knobs: configs/collect.yaml (``--help``).

Example::

    python -m rltrans.collect dataset_id=rltrans/cartpole-mixed-v0 env_id=CartPole-v1 \\
        policy=rltrans.envs.scripted:CartPoleController epsilon=[0,0.5,1] episodes=300
    python -m rltrans.train agent=dt dataset=rltrans/cartpole-mixed-v0
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec
from omegaconf import DictConfig, OmegaConf

from rltrans.checkpoint import describe, space_to_dict
from rltrans.config import ConfigError, run_cli
from rltrans.train import seed_everything, select_device

IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
DATASET_ID = re.compile(r"([\w.-]+/)+[\w.-]+-v\d+")  # namespace(s)/name-vN


class BoundPolicy:
    """A loaded rltrans policy with its acting options fixed, for `collect_episodes`."""

    def __init__(
        self, policy: Any, deterministic: bool | None, target_return: float | None
    ) -> None:
        self.policy = policy
        self.act_kwargs = {} if deterministic is None else {"deterministic": deterministic}
        self.state_kwargs = {} if target_return is None else {"target_return": target_return}

    def initial_state(self, num_envs: int) -> Any:
        """The policy's fresh state (a return-conditioned one aims at target_return)."""
        return self.policy.initial_state(num_envs, **self.state_kwargs)

    def act(self, obs: np.ndarray, state: Any, done: np.ndarray) -> tuple[np.ndarray, Any]:
        """Actions (N, ...) from the policy with the bound options."""
        return self.policy.act(obs, state, done, **self.act_kwargs)

    def observe(self, state: Any, rewards: np.ndarray) -> Any:
        """Rewards (N,) of the last step (a return-to-go counts them down)."""
        return self.policy.observe(state, rewards)


def _import_policy(path: str) -> Any:
    """The object at ``module:attr``; classes and factories are called without arguments."""
    module_name, attr = path.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"policy={path}: cannot import module {module_name!r}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"policy={path}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "act")):
        obj = obj()
    if not (callable(getattr(obj, "act", None)) and callable(getattr(obj, "initial_state", None))):
        raise ConfigError(
            f"policy={path} gives {type(obj).__name__}, which lacks initial_state(n) and "
            f"act(obs, state, done)"
        )
    return obj


def _wrapper_specs(wrappers: list[dict[str, Any]]) -> tuple[WrapperSpec, ...]:
    """configs/env wrappers entries ({path, kwargs}) as Gymnasium WrapperSpecs."""
    specs = []
    for entry in wrappers:
        path = str(entry["path"])
        entry_point = path if ":" in path else ":".join(path.rsplit(".", 1))
        name = entry_point.rsplit(":", 1)[-1]
        specs.append(WrapperSpec(name, entry_point, dict(entry.get("kwargs") or {})))
    return tuple(specs)


def _spec_from_env_config(env_cfg: dict[str, Any]) -> EnvSpec:
    """The EnvSpec of a checkpoint's kind: gym env config (kwargs and wrappers included)."""
    from rltrans.envs.gym_vec import is_ale_spec, resolve_env_spec

    if env_cfg.get("kind") != "gym":
        where = env_cfg.get("name") or env_cfg.get("kind")
        raise ConfigError(
            f"the checkpoint's env is torch-native (kind {env_cfg.get('kind')!r}, {where!r}); a "
            f"Minari dataset records a registered Gymnasium env, so pass env_id=<Gymnasium id "
            f"with the same spaces> to collect in one"
        )
    _, name, spec = resolve_env_spec(str(env_cfg["id"]))
    atari = env_cfg.get("atari", "auto")
    if atari == "on" or (atari == "auto" and is_ale_spec(name, spec)):
        raise ConfigError(
            f"the checkpoint's env {name} uses rltrans's Atari preprocessing, which stacks 4 "
            f"frames per observation; Minari datasets of Atari store single frames (stacked at "
            f"sampling time), so rltrans.collect does not write them. Convert DQN Replay data "
            f"with rltrans.envs.dqn_replay.dqn_replay_to_minari instead"
        )
    kwargs = {**spec.kwargs, **dict(env_cfg.get("kwargs") or {})}
    # gymnasium.make takes the step limit as a keyword; a spec holds it in its own field.
    limit = kwargs.pop("max_episode_steps", spec.max_episode_steps)
    wrappers = _wrapper_specs(list(env_cfg.get("wrappers") or []))
    return dataclasses.replace(
        spec, kwargs=kwargs, max_episode_steps=limit, additional_wrappers=wrappers
    )


def _checkpoint_policy(cfg: DictConfig, device: Any) -> tuple[BoundPolicy, str, dict[str, Any]]:
    """A saved rltrans policy with collect's acting options, its name and its env config."""
    from rltrans.policy import ReturnConditionedPolicy, load_policy, resolve_checkpoint

    path = resolve_checkpoint(str(cfg.policy))
    loaded = load_policy(path, device)
    if cfg.target_return is not None and not isinstance(loaded, ReturnConditionedPolicy):
        raise ConfigError(
            f"target_return applies to return-conditioned policies (agent=dt|bc); {path} "
            f"was trained with algo.kind={loaded.config['algo']['kind']!r}"
        )
    bound = BoundPolicy(loaded, cfg.deterministic, cfg.target_return)
    return bound, f"rltrans checkpoint {path}", loaded.config["env"]


def resolve_policy(cfg: DictConfig, device: Any) -> tuple[Any, EnvSpec, str]:
    """(policy or None for random, the env spec to collect in, a description of the policy)."""
    from rltrans.envs.gym_vec import resolve_env_spec

    source = str(cfg.policy)
    env_spec = None
    if cfg.env_id is not None:
        try:
            env_spec = resolve_env_spec(str(cfg.env_id))[2]
        except (ValueError, ImportError) as err:
            raise ConfigError(f"env_id={cfg.env_id}: {err}") from None
    if source == "random":
        if max(_epsilons(cfg)) > 0:
            raise ConfigError("epsilon mixes a policy with random actions; policy=random is random")
        policy, name = None, "uniform random"
    elif IMPORT_PATH.fullmatch(source) and not Path(source).exists():
        policy, name = _import_policy(source), source
    else:
        policy, name, env_cfg = _checkpoint_policy(cfg, device)
        if env_spec is None:  # the training env, when it is a registered Gymnasium env
            env_spec = _spec_from_env_config(env_cfg)
        _check_spaces(policy.policy, env_spec)
    if env_spec is None:
        raise ConfigError(f"policy={source} needs env_id=<Gymnasium id> (e.g. CartPole-v1)")
    if cfg.max_episode_steps is not None:
        env_spec = dataclasses.replace(env_spec, max_episode_steps=int(cfg.max_episode_steps))
    return policy, env_spec, name


def _check_spaces(policy: Any, spec: EnvSpec) -> None:
    """Clear error when the collection env's spaces differ from the policy's."""
    probe = gym.make(spec)
    try:
        for what in ("observation_space", "action_space"):
            ours, theirs = space_to_dict(getattr(policy, what)), space_to_dict(getattr(probe, what))
            if ours != theirs:
                raise ConfigError(
                    f"the policy acts on {what.replace('_', ' ')} {describe(ours)} but env "
                    f"{spec.id} has {describe(theirs)}; choose an env_id with the same spaces"
                )
    finally:
        probe.close()


def _epsilons(cfg: DictConfig) -> list[float]:
    values = list(cfg.epsilon) if OmegaConf.is_list(cfg.epsilon) else [cfg.epsilon]
    eps = [float(v) for v in values]
    if not eps or any(not 0.0 <= e <= 1.0 for e in eps):
        raise ConfigError(f"epsilon={cfg.epsilon}; valid: a number in [0, 1] or a list of them")
    return eps


def collect(cfg: DictConfig) -> dict[str, Any]:
    """Collect the episodes a config describes, write the dataset, return the summary."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    from rltrans.envs.minari_data import collect_episodes, write_minari

    if cfg.dataset_id is None:
        raise ConfigError("dataset_id=<namespace/name-vN> is required, e.g. rltrans/cartpole-v0")
    if not DATASET_ID.fullmatch(str(cfg.dataset_id)):
        raise ConfigError(
            f"dataset_id={cfg.dataset_id}; expected Minari's namespace/name-vN, "
            f"e.g. rltrans/cartpole-mixed-v0"
        )
    parse_dataset_id(str(cfg.dataset_id))  # Minari's own check of the parts
    if cfg.episodes < 1 or cfg.num_envs < 1:
        raise ConfigError(f"episodes={cfg.episodes} and num_envs={cfg.num_envs} must be >= 1")
    path = Path(get_dataset_path(str(cfg.dataset_id)))
    if path.exists() and not cfg.overwrite:  # fail before collecting, not after
        raise ConfigError(f"dataset {cfg.dataset_id} exists at {path}; pass overwrite=true")
    device = select_device(cfg.device)
    seed_everything(cfg.seed)
    policy, spec, name = resolve_policy(cfg, device)
    epsilons = _epsilons(cfg)

    # Episodes split evenly over the epsilon values, each part with its own seeds.
    episodes = []
    for i, eps in enumerate(epsilons):
        count = cfg.episodes // len(epsilons) + (i < cfg.episodes % len(epsilons))
        if count == 0:
            continue
        episodes += collect_episodes(
            spec,
            policy,
            episodes=count,
            epsilon=eps if policy is not None else 0.0,
            seed=cfg.seed + 100_003 * i,  # disjoint env seeds per part
            num_envs=min(cfg.num_envs, count),
            progress=cfg.progress,
        )
    mix = f" with epsilon {epsilons if len(epsilons) > 1 else epsilons[0]}" if policy else ""
    description = cfg.description or (
        f"{len(episodes)} episodes of {name}{mix} in {spec.id}, written by rltrans.collect "
        f"(seed {cfg.seed})."
    )
    written = write_minari(
        str(cfg.dataset_id),
        episodes,
        env=spec,
        algorithm_name=name + mix,
        author=cfg.author,
        author_email=cfg.author_email,
        description=description,
        overwrite=bool(cfg.overwrite),
    )
    returns = np.array([ep.episode_return for ep in episodes])
    return {
        "dataset_id": str(cfg.dataset_id),
        "path": str(written),
        "env_id": spec.id,
        "policy": name,
        "epsilon": epsilons if len(epsilons) > 1 else epsilons[0],
        "episodes": len(episodes),
        "steps": int(sum(len(ep) for ep in episodes)),
        "mean_return": float(returns.mean()),
        "min_return": float(returns.min()),
        "max_return": float(returns.max()),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, collect, write, print one JSON line."""
    return run_cli(argv, "collect", __doc__, collect)


if __name__ == "__main__":
    sys.exit(main())
