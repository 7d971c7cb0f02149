"""Minari datasets: write episodes without jax, load them back.

Minari's own `DataCollector` needs jax (`EpisodeBuffer.add_step_data` uses
`jax.tree_util`), so `write_minari` builds whole-episode `EpisodeBuffer`s itself and calls
`minari.create_dataset_from_buffers`, which does not import jax. Episodes are collected by
`rltrans.runtime.collection.collect_episodes` (the acting loop).
Datasets live where Minari looks: `$MINARI_DATASETS_PATH`, default `~/.minari/datasets`.
"""

from __future__ import annotations

import inspect
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import minari
import numpy as np
from gymnasium.envs.registration import EnvSpec
from minari.data_collector.episode_buffer import EpisodeBuffer
from minari.dataset.minari_dataset import parse_dataset_id
from minari.storage.datasets_root_dir import get_dataset_path
from tqdm.auto import tqdm

from rltrans.envs.dataset_checks import check_actions, check_finite, check_returns
from rltrans.envs.minari_checks import HDF5_FILE, check_minari_files
from rltrans.envs.offline import DatasetError, Episode, OfflineDataset, make_eval_env_fn

__all__ = [
    "CorruptDatasetError",
    "load_minari",
    "make_eval_env_fn",
    "write_minari",
]

SUPPORTED_SPACES = (gym.spaces.Box, gym.spaces.Discrete)
DataFormat = Literal["hdf5", "arrow"]
MissingFinal = Literal["error", "repeat_last"]


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


class CorruptDatasetError(ValueError):
    """A local Minari dataset whose files cannot be read; the message says how to rebuild it."""

    def __init__(self, dataset_id: str, folder: Path, err: BaseException) -> None:
        files = sorted(str(p) for p in (folder / "data").glob("*")) or [str(folder / "data")]
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        super().__init__(
            f"Minari dataset {dataset_id!r} is corrupt or truncated ({first}); files: "
            f"{', '.join(files)}. Rebuild it: delete {folder} and write it again (e.g. "
            f"python -m rltrans.collect dataset_id={dataset_id} overwrite=true ...)"
        )


def _check_values(ep: Any, dataset: Any, where: str) -> None:
    """Refuse an episode whose rewards or observations are not finite or whose actions the
    action space does not hold (vectorised: one pass per array)."""
    space = dataset.observation_space
    obs = np.asarray(ep.observations)
    if obs.shape[1:] != space.shape:
        raise DatasetError(
            f"{where}: observations have shape {obs.shape}, expected (T+1, "
            f"{', '.join(map(str, space.shape))}) for {space}"
        )
    check_finite(obs, where, "observations")
    rewards = np.asarray(ep.rewards)
    check_finite(rewards, where, "rewards")
    check_returns(rewards, where)
    check_actions(np.asarray(ep.actions), dataset.action_space, where)


def _read_episodes(dataset: Any, dataset_id: str, progress: bool) -> list[Episode]:
    """Every episode of a Minari dataset, observations as views (T of the T+1 stored)."""
    episodes = []
    data = _local_dataset_dir(dataset_id) / "data"
    hdf5 = dataset.storage.metadata.get("data_format") == "hdf5"
    for ep in tqdm(
        dataset.iterate_episodes(),
        total=dataset.total_episodes,
        desc=f"loading {dataset_id}",
        disable=not progress,
    ):
        file = data / HDF5_FILE if hdf5 else data / str(ep.id)  # Arrow: a folder per episode
        _check_values(ep, dataset, f"{file} episode_{ep.id}")
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
    return episodes


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
    try:
        # Sizes the files declare, against the files and the caps, before Minari allocates
        # from them.
        check_minari_files(_local_dataset_dir(dataset_id))
        dataset = minari.load_dataset(dataset_id)
        _check_space(dataset.observation_space, "observation", dataset_id)
        _check_space(dataset.action_space, "action", dataset_id)
        episodes = _read_episodes(dataset, dataset_id, progress)
    except (OSError, KeyError, EOFError) as err:  # h5py: truncated or garbled file
        raise CorruptDatasetError(dataset_id, _local_dataset_dir(dataset_id), err) from None
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


def _check_arguments(
    data_format: str, missing_final: str, ref_min: float | None, ref_max: float | None
) -> None:
    """ValueError naming the first of write_minari's choices that is not valid."""
    if data_format not in ("hdf5", "arrow"):
        raise ValueError(f"data_format={data_format!r}; valid: ['hdf5', 'arrow']")
    if missing_final not in ("error", "repeat_last"):
        raise ValueError(
            f"missing_final_observation={missing_final!r}; valid: ['error', 'repeat_last']"
        )
    if (ref_min is None) != (ref_max is None) or (ref_min is not None and ref_min >= ref_max):
        # Minari would fill in a missing one by playing episodes in the eval env; a minimum
        # not below the maximum is what the reader refuses (OfflineDataset.reference_scores).
        raise ValueError(
            f"ref_min_score={ref_min} and ref_max_score={ref_max}: give both, the first below "
            f"the second, or neither"
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
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
) -> Path:
    """Write episodes as Minari dataset `dataset_id` (no jax needed); returns its directory.

    `env` is the collection env (its spaces are used unless given); `eval_env` defaults to it.
    Image observations are stored losslessly unless `jpeg_encoding=True` (Minari's default).
    `ref_min_score` and `ref_max_score` (both or neither) are the reference returns D4RL's
    normalised score divides by, stored as Minari stores them.

    Example:
        >>> eps = collect_episodes("CartPole-v1", None, episodes=10)  # doctest: +SKIP
        >>> write_minari("rltrans/cartpole-random-v0", eps, env="CartPole-v1",  # doctest: +SKIP
        ...              algorithm_name="random", author="me", description="10 random episodes")
    """
    parse_dataset_id(dataset_id)  # Minari's own id check, before anything touches the disk
    _check_arguments(data_format, missing_final_observation, ref_min_score, ref_max_score)
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
    if ref_min_score is not None:
        metadata.update(ref_min_score=float(ref_min_score), ref_max_score=float(ref_max_score))
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
