"""Minari datasets: collect episodes from a vector env, write them without jax, load them back.

Minari's own `DataCollector` needs jax (`EpisodeBuffer.add_step_data` uses
`jax.tree_util`), so `write_minari` builds whole-episode `EpisodeBuffer`s itself and calls
`minari.create_dataset_from_buffers`, which does not import jax (notes/STACK.md §3).
Datasets live where Minari looks: `$MINARI_DATASETS_PATH`, default `~/.minari/datasets`.
"""

from __future__ import annotations

import inspect
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

import gymnasium as gym
import minari
import numpy as np
from gymnasium.envs.registration import EnvSpec
from minari.data_collector.episode_buffer import EpisodeBuffer
from minari.dataset.minari_dataset import parse_dataset_id
from minari.storage.datasets_root_dir import get_dataset_path
from rltrans.envs.offline import Episode, OfflineDataset, make_eval_env_fn
from tqdm.auto import tqdm

__all__ = [
    "EpisodePolicy",
    "collect_episodes",
    "load_minari",
    "make_eval_env_fn",
    "write_minari",
]

SUPPORTED_SPACES = (gym.spaces.Box, gym.spaces.Discrete)
DataFormat = Literal["hdf5", "arrow"]
MissingFinal = Literal["error", "repeat_last"]


class EpisodePolicy(Protocol):
    """What `collect_episodes` needs from a policy (memory policies reset where `done`).

    A policy may also define `observe(state, rewards) -> state`, called with the rewards (N,)
    of every step: return-conditioned policies (Decision Transformer) count them down from
    their target return.
    """

    def initial_state(self, num_envs: int) -> Any:
        """Per-env state for `num_envs` envs (None for memoryless policies)."""
        ...

    def act(self, obs: np.ndarray, state: Any, done: np.ndarray) -> tuple[np.ndarray, Any]:
        """Actions (N, ...) for obs (N, ...); `done` (N,) marks envs whose episode just began."""
        ...


def _check_space(space: gym.Space, what: str, where: str) -> None:
    if not isinstance(space, SUPPORTED_SPACES):
        raise ValueError(
            f"{where}: unsupported {what} space {space!r}; supported: "
            f"{[s.__name__ for s in SUPPORTED_SPACES]}"
        )


# ---------------------------------------------------------------------------------------------
# Loading


def _local_dataset_dir(dataset_id: str) -> Path:
    # Minari's own rule: $MINARI_DATASETS_PATH (default ~/.minari/datasets) / <id>.
    return Path(get_dataset_path(dataset_id))


def _missing_dataset_error(dataset_id: str) -> FileNotFoundError:
    root = Path(get_dataset_path())
    local = sorted(minari.list_local_datasets())
    listing = "\n".join(f"  {d}" for d in local) if local else "  (none)"
    return FileNotFoundError(
        f"Minari dataset {dataset_id!r} is not local: "
        f"looked for {_local_dataset_dir(dataset_id) / 'data'} "
        f"(datasets root {root}, set by MINARI_DATASETS_PATH, default ~/.minari/datasets).\n"
        f"Local datasets:\n{listing}\n"
        f"Create it with `python -m rltrans.collect ...` (writes a Minari dataset from a policy), "
        f"or download it with load_minari({dataset_id!r}, download=True) on a machine with "
        f'network access and `pip install "minari[hf]"`.'
    )


def _eval_env_spec(dataset: minari.MinariDataset) -> EnvSpec | None:
    """The evaluation env spec stored in the metadata, else the collection env spec.

    Same rule as `MinariDataset.recover_environment(eval_env=True)`, but without building
    the env, so loading data never needs the env's packages (ale-py, mujoco).
    """
    raw = dataset.storage.metadata.get("eval_env_spec")
    if raw is None:
        return dataset.env_spec
    # Minari strips keys that gymnasium < 1.0 wrote and 1.x rejects; do the same.
    for stale in (
        '"order_enforce": true,',
        '"apply_api_compatibility": false,',
        '"autoreset": false, ',
    ):
        raw = raw.replace(stale, "")
    return EnvSpec.from_json(raw)


def _frame_stack_of(spec: EnvSpec | None) -> int:
    # An eval env that stacks frames (e.g. converted DQN Replay data) means the policy sees
    # stacks of that many dataset rows.
    if spec is None:
        return 1
    for wrapper in spec.additional_wrappers:
        if wrapper.name == "FrameStackObservation":
            return int(wrapper.kwargs.get("stack_size", 1))
    return 1


def load_minari(
    dataset_id: str, *, download: bool = False, progress: bool = True
) -> OfflineDataset:
    """Load a Minari dataset by id into an `OfflineDataset` (Box/Discrete spaces only).

    Example:
        >>> ds = load_minari("rltrans/cartpole-random-v0")  # doctest: +SKIP
        >>> envs = gym.make_vec(ds.env_spec, 8, vectorization_mode="sync")  # doctest: +SKIP
    """
    if not (_local_dataset_dir(dataset_id) / "data").exists():
        if not download:
            raise _missing_dataset_error(dataset_id)
        try:
            # Minari's real remote path (Hugging Face / GCS); needs minari[hf] and network.
            minari.load_dataset(dataset_id, download=True)
        except Exception as exc:
            raise RuntimeError(
                f"downloading Minari dataset {dataset_id!r} failed ({type(exc).__name__}: {exc}). "
                f"Create it locally with `python -m rltrans.collect ...` instead."
            ) from exc
    dataset = minari.load_dataset(dataset_id)
    _check_space(dataset.observation_space, "observation", dataset_id)
    _check_space(dataset.action_space, "action", dataset_id)

    episodes = []
    for ep in tqdm(
        dataset.iterate_episodes(),
        total=dataset.total_episodes,
        desc=f"loading {dataset_id}",
        disable=not progress,
    ):
        obs = ep.observations  # (T+1, ...): Minari stores the final observation too
        episodes.append(
            Episode(
                observations=obs[:-1],  # (T, ...) a view
                actions=ep.actions,
                rewards=ep.rewards,
                terminated=bool(ep.terminations[-1]),
                truncated=bool(ep.truncations[-1]),
                final_observation=obs[-1],
            )
        )
    spec = _eval_env_spec(dataset)
    return OfflineDataset(
        episodes=episodes,
        observation_space=dataset.observation_space,
        action_space=dataset.action_space,
        name=dataset_id,
        env_spec=spec,
        frame_stack=_frame_stack_of(spec),
        info={"source": "minari", "metadata": dict(dataset.storage.metadata)},
    )


# ---------------------------------------------------------------------------------------------
# Writing


def _episode_buffer(index: int, ep: Episode, missing_final: MissingFinal) -> EpisodeBuffer:
    final = ep.final_observation
    if final is None:
        if missing_final == "error":
            raise ValueError(
                f"episode {index} has no final_observation, which Minari needs (T+1 observations); "
                f"pass missing_final_observation='repeat_last' to store its last observation again"
            )
        final = ep.observations[-1]
    t = len(ep)
    terminations = np.zeros(t, dtype=bool)
    truncations = np.zeros(t, dtype=bool)
    terminations[-1], truncations[-1] = ep.terminated, ep.truncated
    return EpisodeBuffer(
        id=index,
        observations=np.concatenate([ep.observations, np.asarray(final)[None]]),  # (T+1, ...)
        actions=ep.actions,
        rewards=ep.rewards,
        terminations=terminations,
        truncations=truncations,
        infos={},
    )


def write_minari(
    dataset_id: str,
    episodes: Iterable[Episode],
    *,
    env: str | EnvSpec | None,
    algorithm_name: str,
    author: str,
    description: str,
    eval_env: str | EnvSpec | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
    data_format: DataFormat = "hdf5",
    jpeg_encoding: bool = False,
    missing_final_observation: MissingFinal = "error",
    overwrite: bool = False,
) -> Path:
    """Write episodes as Minari dataset `dataset_id` (no jax needed); returns its directory.

    `env` is the collection env (its spaces are used unless given); `eval_env` defaults to it.
    Image observations are stored losslessly unless `jpeg_encoding=True` (Minari's default).

    Example:
        >>> eps = collect_episodes("CartPole-v1", None, episodes=10)  # doctest: +SKIP
        >>> write_minari("rltrans/cartpole-random-v0", eps, env="CartPole-v1",  # doctest: +SKIP
        ...              algorithm_name="random", author="me", description="10 random episodes")
    """
    parse_dataset_id(dataset_id)  # Minari's own id check, before anything touches the disk
    if data_format not in ("hdf5", "arrow"):
        raise ValueError(f"data_format={data_format!r}; valid: ['hdf5', 'arrow']")
    if missing_final_observation not in ("error", "repeat_last"):
        raise ValueError(
            f"missing_final_observation={missing_final_observation!r}; "
            f"valid: ['error', 'repeat_last']"
        )
    if env is None and (observation_space is None or action_space is None):
        raise ValueError("env=None needs both observation_space and action_space")
    if env is not None and (observation_space is None or action_space is None):
        probe = gym.make(env)  # Minari would do the same to read the spaces
        observation_space = observation_space or probe.observation_space
        action_space = action_space or probe.action_space
        probe.close()
    _check_space(observation_space, "observation", dataset_id)
    _check_space(action_space, "action", dataset_id)

    metadata = dict(
        algorithm_name=algorithm_name,
        author=author,
        author_email=author_email,
        code_permalink=code_permalink,
        observation_space=observation_space,
        action_space=action_space,
        description=description,
        data_format=data_format,
    )
    if "jpeg_encoding" in inspect.signature(minari.create_dataset_from_buffers).parameters:
        metadata["jpeg_encoding"] = jpeg_encoding
    elif jpeg_encoding:  # Minari releases before the option never encode frames
        raise ValueError(f"jpeg_encoding=True needs a newer Minari than {minari.__version__}")
    path = _local_dataset_dir(dataset_id)
    if path.exists():
        if not overwrite:
            raise FileExistsError(
                f"Minari dataset {dataset_id!r} already exists at {path}; pass overwrite=True to "
                f"replace it or choose another id/version"
            )
        shutil.rmtree(path)

    # A generator, so only one episode's (T+1, ...) observation copy exists at a time; Minari's
    # storage only iterates the buffer list.
    buffers = (_episode_buffer(i, ep, missing_final_observation) for i, ep in enumerate(episodes))
    try:
        _create(dataset_id, buffers, env, eval_env if eval_env is not None else env, **metadata)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # leave no half-written dataset behind
        raise
    return path


def _create(
    dataset_id: str,
    buffers: Iterable[EpisodeBuffer],
    env: str | EnvSpec | None,
    eval_env: str | EnvSpec | None,
    **kwargs: Any,
) -> None:
    with warnings.catch_warnings():
        # Optional contact/provenance fields: Minari nags when they are None.
        warnings.filterwarnings("ignore", message="`author_email` is set to None")
        warnings.filterwarnings("ignore", message="`code_permalink` is set to None")
        warnings.filterwarnings("ignore", message="env_spec is None")
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,  # type: ignore[arg-type]
            env=env,
            eval_env=eval_env,
            **kwargs,
        )


# ---------------------------------------------------------------------------------------------
# Collecting


def collect_episodes(
    env_id: str | EnvSpec,
    policy: EpisodePolicy | None,
    *,
    episodes: int,
    epsilon: float = 0.0,
    seed: int = 0,
    num_envs: int = 8,
    max_steps: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
) -> list[Episode]:
    """Run `policy` (None: uniform random) in a sync vector env and return `episodes` episodes.

    With `epsilon`, each env's action is replaced by a uniformly random one with probability
    `epsilon`. `max_steps` caps each episode's length (truncation); to record that limit in a
    dataset, pass one `EnvSpec` (e.g. `dataclasses.replace(gym.spec(id), max_episode_steps=..)`)
    here and to `write_minari(env=...)` instead. Episodes are numbered in
    the order they start and the first `episodes` of them are kept, so the quota never
    favours short episodes (a length-ordered cut would: short ones finish first).

    Example:
        >>> eps = collect_episodes("CartPole-v1", None, episodes=20, num_envs=4)  # doctest: +SKIP
    """
    if episodes < 1 or num_envs < 1:
        raise ValueError(f"episodes={episodes} and num_envs={num_envs} must be >= 1")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon={epsilon} must lie in [0, 1]")
    kwargs = dict(env_kwargs or {})
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    # SAME_STEP autoreset: the step that ends an episode already returns the next reset obs and
    # puts the final obs in info["final_obs"], so no dummy transition follows a done.
    envs = gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )
    try:
        return _collect(envs, policy, episodes, epsilon, seed, progress)
    finally:
        envs.close()


def _collect(
    envs: gym.vector.VectorEnv,
    policy: EpisodePolicy | None,
    quota: int,
    epsilon: float,
    seed: int,
    progress: bool,
) -> list[Episode]:
    n = envs.num_envs
    rng = np.random.default_rng(seed)
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    state = policy.initial_state(n) if policy is not None else None
    observe = getattr(policy, "observe", None)  # optional hook, looked up once
    done = np.ones(n, dtype=bool)  # every env starts an episode at the first step
    slot = np.arange(n)  # start-order number of each env's current episode
    next_slot = n
    steps: list[list[tuple[np.ndarray, np.ndarray, float]]] = [[] for _ in range(n)]
    finished: dict[int, Episode] = {}
    bar = tqdm(total=quota, desc="collecting episodes", unit="ep", disable=not progress)
    while len(finished) < quota:
        random_actions = envs.action_space.sample()  # (N, ...)
        if policy is None:
            actions = random_actions
        else:
            actions, state = policy.act(obs, state, done)
            # The action space's dtype, so Minari stores what the env was given.
            actions = np.asarray(actions, dtype=random_actions.dtype).reshape(random_actions.shape)
            if epsilon > 0.0:
                explore = rng.random(n) < epsilon  # (N,)
                mask = explore.reshape((n,) + (1,) * (actions.ndim - 1))
                actions = np.where(mask, random_actions, actions).astype(random_actions.dtype)
        next_obs, rewards, terminated, truncated, info = envs.step(actions)
        done = np.logical_or(terminated, truncated)
        if observe is not None:
            state = observe(state, rewards)
        for i in range(n):
            if slot[i] < quota:  # episodes started after the quota are run but not recorded
                steps[i].append((np.array(obs[i]), np.array(actions[i]), float(rewards[i])))
            if not done[i]:
                continue
            if slot[i] < quota:
                finished[int(slot[i])] = _to_episode(
                    steps[i], info["final_obs"][i], terminated[i], truncated[i]
                )
                bar.update(1)
            steps[i] = []
            slot[i], next_slot = next_slot, next_slot + 1
        obs = next_obs
    bar.close()
    return [finished[k] for k in range(quota)]


def _to_episode(
    steps: list[tuple[np.ndarray, np.ndarray, float]],
    final_obs: np.ndarray,
    terminated: bool,
    truncated: bool,
) -> Episode:
    observations, actions, rewards = zip(*steps, strict=True)
    return Episode(
        observations=np.stack(observations),  # (T, ...)
        actions=np.stack(actions),  # (T, ...)
        rewards=np.asarray(rewards, dtype=np.float32),  # (T,)
        terminated=bool(terminated),
        truncated=bool(truncated),
        final_observation=np.array(final_obs),
    )
