"""python -m rltrans.collect dataset_id=<namespace/name-vN> episodes=N [policy=...] [key=value ...]

Writes a Minari dataset (hdf5, no jax) of episodes played by

* ``policy=random``: uniform random actions (``env_id=`` required);
* ``policy=<checkpoint file or run dir>``: a saved rltrans policy (``rltrans.load_policy``),
  in its training env unless ``env_id=`` names another with the same spaces;
* ``policy=<module:attr>``: a Python policy with rltrans's acting interface
  (``initial_state(n)``, ``act(obs, state, done, deterministic=) -> (ActOutput, state)``,
  ``observe(state, reward)``; a class or factory is called without arguments), e.g.
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
import errno
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec
from omegaconf import DictConfig, OmegaConf

from rltrans.accel.run_speed import thread_tuners
from rltrans.cli import run_cli
from rltrans.config import ConfigError
from rltrans.fsutil import StorageError, check_writable, free_bytes
from rltrans.policy import check_env_code
from rltrans.run.context import building, payload_spaces, setup
from rltrans.spaces import SpaceMismatchError, check_same_spaces

IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
DATASET_ID = re.compile(r"([\w.-]+/)+[\w.-]+-v\d+")  # namespace(s)/name-vN


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
    methods = ("initial_state", "act", "observe")
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise ConfigError(
            f"policy={path} gives {type(obj).__name__}, which lacks {', '.join(missing)}; a "
            f"policy has initial_state(n), act(obs, state, done, deterministic=) -> "
            f"(rltrans.types.ActOutput, state) and observe(state, reward)"
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


def _checkpoint_policy(cfg: DictConfig, device: Any) -> tuple[Any, str, dict[str, Any]]:
    """A saved rltrans agent, its name, its env config, its spaces and its initial-state
    arguments (a return-conditioned policy's target)."""
    from rltrans.config.resources import check_resources
    from rltrans.policy import agent_from_checkpoint, check_payload, resolve_checkpoint
    from rltrans.run.checkpoint import load_checkpoint

    path = resolve_checkpoint(str(cfg.policy))
    payload = load_checkpoint(path, map_location=device)
    # The one estimate, once this command line and the checkpoint's config are combined.
    check_payload(payload, f"checkpoint {path}")
    envs = min(int(cfg.num_envs), int(cfg.episodes))
    check_resources(payload["config"], spaces=payload_spaces(payload), acting_envs=envs)
    agent, entry = agent_from_checkpoint(payload, device, source=f"checkpoint {path}")
    config = payload["config"]
    if cfg.target_return is not None and not entry.return_conditioned:
        raise ConfigError(
            f"target_return applies to return-conditioned policies (agent=dt|bc); {path} "
            f"holds agent.kind={config['agent'].get('kind', 'memory')!r}"
        )
    env = payload.get("eval_env") or config["env"]  # offline runs record the env they used
    info: dict[str, Any] = {"env": env, "spaces": payload_spaces(payload)}
    info["deterministic"] = True
    if entry.return_conditioned:
        best = (payload.get("dataset") or {}).get("max_return")
        targets = payload.get("eval_targets") or ([best] if best is not None else [])
        if cfg.target_return is None and not targets:
            raise ConfigError(f"{path} records no target return; pass target_return=<number>")
        info["target"] = max(targets) if cfg.target_return is None else cfg.target_return
        info["deterministic"] = bool(config.get("algo", {}).get("eval_deterministic", False))
    info["source"] = f"the env config of checkpoint {path}"
    return agent, f"rltrans checkpoint {path}", info


def resolve_policy(cfg: DictConfig, device: Any) -> tuple[Any, EnvSpec, str, dict[str, Any]]:
    """(policy or None for random, the env spec to collect in, a description of the policy,
    what a checkpoint policy needs to act: its target and default deterministic flag)."""
    from rltrans.envs.gym_vec import resolve_env_spec

    source = str(cfg.policy)
    env_spec, info = None, {}
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
        policy, name, info = _checkpoint_policy(cfg, device)
        if env_spec is None:  # the training env, when it is a registered Gymnasium env
            check_env_code(info["env"], cfg.trust_env_code, info["source"])
            with building("env"):
                env_spec = _spec_from_env_config(info["env"])
        _check_spaces(info["spaces"], env_spec)
    if env_spec is None:
        raise ConfigError(f"policy={source} needs env_id=<Gymnasium id> (e.g. CartPole-v1)")
    if cfg.max_episode_steps is not None:
        env_spec = dataclasses.replace(env_spec, max_episode_steps=int(cfg.max_episode_steps))
    return policy, env_spec, name, info


def _check_spaces(spaces: tuple[gym.Space, gym.Space], spec: EnvSpec) -> None:
    """Clear error when the collection env's spaces differ from the policy's."""
    with building("env"):
        probe = gym.make(spec)
    try:
        check_same_spaces(
            spaces,
            (probe.observation_space, probe.action_space),
            expected_label="the policy acts on",
            actual_label=f"env {spec.id} has",
        )
    except SpaceMismatchError as err:
        raise ConfigError(f"{err}; choose an env_id with the same spaces") from None
    finally:
        probe.close()


def _epsilons(cfg: DictConfig) -> list[float]:
    values = list(cfg.epsilon) if OmegaConf.is_list(cfg.epsilon) else [cfg.epsilon]
    eps = [float(v) for v in values]
    if not eps or any(not 0.0 <= e <= 1.0 for e in eps):
        raise ConfigError(f"epsilon={cfg.epsilon}; valid: a number in [0, 1] or a list of them")
    return eps


def _dataset_path(cfg: DictConfig) -> Path:
    """Where ``dataset_id`` will be written; refused before collecting when the id is bad or
    the dataset exists without ``overwrite=true``."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    if cfg.dataset_id is None:
        raise ConfigError("dataset_id=<namespace/name-vN> is required, e.g. rltrans/cartpole-v0")
    if not DATASET_ID.fullmatch(str(cfg.dataset_id)):
        raise ConfigError(
            f"dataset_id={cfg.dataset_id}; expected Minari's namespace/name-vN, "
            f"e.g. rltrans/cartpole-mixed-v0"
        )
    parse_dataset_id(str(cfg.dataset_id))  # Minari's own check of the parts
    references = (cfg.ref_min_score, cfg.ref_max_score)
    if (references[0] is None) != (references[1] is None) or (
        references[0] is not None and references[0] >= references[1]
    ):
        raise ConfigError(
            f"ref_min_score={references[0]} and ref_max_score={references[1]}: give both, "
            f"the first below the second (D4RL's random and expert returns), or neither"
        )
    if cfg.episodes < 1 or cfg.num_envs < 1:
        raise ConfigError(f"episodes={cfg.episodes} and num_envs={cfg.num_envs} must be >= 1")
    path = Path(get_dataset_path(str(cfg.dataset_id)))
    if path.exists() and not cfg.overwrite:  # fail before collecting, not after
        raise ConfigError(f"dataset {cfg.dataset_id} exists at {path}; pass overwrite=true")
    check_writable(path, f"dataset {cfg.dataset_id}")  # a read-only datasets root, say
    return path


def _check_room(dataset_id: str, path: Path, episodes: list[Any]) -> None:
    """StorageError before writing when the disk cannot hold the episodes: HDF5 fails a
    full disk's write inside its own cleanup (a segfault, not an error a caller can catch)."""
    free = free_bytes(check_writable(path, f"dataset {dataset_id}"))
    if free is None:
        return
    if path.is_dir():  # overwrite=true: the old dataset is removed first
        free += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    # Arrays as stored (T+1 observations, actions, rewards, two flags) and HDF5's layout:
    # about 15 KB per episode's group (200 CartPole episodes took 3.0 MB for 150 KB of data).
    need = 2**16 + sum(
        ep.observations.nbytes * (len(ep) + 1) // max(1, len(ep))
        + ep.actions.nbytes + ep.rewards.nbytes + 2 * len(ep) + 2**14
        for ep in episodes
    )  # fmt: skip
    if need > free:
        raise StorageError(
            errno.ENOSPC, f"cannot write dataset {dataset_id}: its {len(episodes)} episodes "
            f"need about {need / 2**20:.1f} MiB at {path}, where {free / 2**20:.1f} MiB are "
            f"free; nothing was written: free space or point MINARI_DATASETS_PATH elsewhere"
        )  # fmt: skip


def collect(cfg: DictConfig) -> dict[str, Any]:
    """Collect the episodes a config describes, write the dataset, return the summary."""
    from rltrans.envs.minari_data import write_minari
    from rltrans.runtime.collection import collect_episodes

    path = _dataset_path(cfg)
    device = setup(cfg)
    policy, spec, name, info = resolve_policy(cfg, device)
    epsilons = _epsilons(cfg)
    threads = thread_tuners(cfg.get("torch_threads"), device, None, "acting step").get(
        "acting step"
    )
    deterministic = cfg.deterministic
    if deterministic is None:  # the policy's default
        deterministic = info.get("deterministic", False)
    n = cfg.num_envs
    root = "$MINARI_DATASETS_PATH" if os.environ.get("MINARI_DATASETS_PATH") else "Minari's default"
    print(f"collecting {cfg.dataset_id} into {path} ({root})", file=sys.stderr, flush=True)

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
            num_envs=min(n, count),
            deterministic=bool(deterministic),
            device=device,
            state=_initial_state(policy, min(n, count), info.get("target"), device),
            progress=cfg.progress,
            threads=threads,
        )
    mix = f" with epsilon {epsilons if len(epsilons) > 1 else epsilons[0]}" if policy else ""
    description = cfg.description or (
        f"{len(episodes)} episodes of {name}{mix} in {spec.id}, written by rltrans.collect "
        f"(seed {cfg.seed})."
    )
    _check_room(str(cfg.dataset_id), path, episodes)
    written = write_minari(
        str(cfg.dataset_id),
        episodes,
        env=spec,
        algorithm_name=name + mix,
        author=cfg.author,
        author_email=cfg.author_email,
        description=description,
        overwrite=bool(cfg.overwrite),
        ref_min_score=cfg.ref_min_score,
        ref_max_score=cfg.ref_max_score,
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


def _initial_state(policy: Any, num_envs: int, target: float | None, device: Any) -> Any:
    """A return-conditioned checkpoint policy's state aiming at ``target``; else the default."""
    if target is None:
        return None
    import torch

    return policy.initial_state(num_envs, torch.full((num_envs,), float(target), device=device))


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, collect, write, print one JSON line."""
    return run_cli(argv, "collect", __doc__, collect)


if __name__ == "__main__":
    sys.exit(main())
