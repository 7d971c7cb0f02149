"""Build a Gymnasium vector env from any registered id, the way the whole library expects it.

Contract of the returned ``gymnasium.vector.VectorEnv`` (N sub-envs):

* Autoreset is ``AutoresetMode.SAME_STEP``: at a step where env i ends (``terminated | truncated``),
  ``obs[i]`` is already the first observation of its next episode and the real last observation
  is ``info["final_obs"][i]`` (mask ``info["_final_obs"]``), with that step's info in
  ``info["final_info"]``. There is never a NEXT_STEP dummy transition (reward 0, action ignored).
* Game statistics: at the step where env i's *game* ended, ``info["episode"] = {"r": float64 (N,),
  "l": int64 (N,)}`` and ``info["_episode"]`` is a bool mask (N,). The keys are absent at steps
  where no game ended (Gymnasium's convention). They are recorded by a
  ``gymnasium.wrappers.RecordEpisodeStatistics`` placed directly on the env from
  ``gymnasium.make`` (before any preprocessing or user wrapper), under the info key
  :data:`GAME_STATS_KEY`, and lifted to the vector level by :class:`GameEpisodeStatistics`.
  So ``r`` is the unclipped game score and ``l`` counts raw env steps - for Atari that is emulator
  frames (4 per agent step, no-op starts included), the convention of CleanRL and SB3's Monitor.
  With episodic life (Atari training) the learner sees ``terminated`` at every life loss, but
  ``info["episode"]`` appears only when the game is over.
* ``seed``: the first ``reset()`` that passes no seed uses ``seed`` (sub-env i gets ``seed + i``,
  Gymnasium's rule); later resets continue each env's RNG. The action spaces are seeded too.

Sub-env wrapping order: ``gymnasium.make(id, **env_kwargs)`` -> RecordEpisodeStatistics ->
Atari preprocessing (if on, see :mod:`rltrans.envs.atari`) -> ``wrappers`` entries in order.
"""

from __future__ import annotations

import difflib
import importlib
import multiprocessing
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, find_highest_version, get_env_id, parse_env_id
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.wrappers import RecordEpisodeStatistics

from rltrans.envs.atari import wrap_atari

# Private info key of the raw-env statistics, so that an env or user wrapper that writes its own
# info["episode"] cannot collide with (or trip RecordEpisodeStatistics' assert on) ours.
GAME_STATS_KEY = "rltrans_game"
_WRAPPER_KEYS = ("path", "kwargs", "phase")
WRAPPER_PHASES = ("both", "training", "evaluation")  # which envs a wrappers entry wraps
_VECTORIZATIONS = ("sync", "async")
_ATARI_MODES = ("auto", "on", "off")


def _import_module_of_id(module: str, env_id: str) -> None:
    """Imports the module named in a ``module:EnvId`` id so that it registers its envs."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"env id {env_id!r}: importing module {module!r} (which should register "
            f"{env_id.split(':', 1)[1]!r}) failed: {e}. Install the package that provides it "
            "or fix the module name before the ':'."
        ) from e


def _register_ale() -> None:
    """Registers the ``ALE/*`` ids (Gymnasium >= 1.0 no longer imports ale_py by itself)."""
    try:
        import ale_py
    except ImportError as e:
        raise ImportError(
            "ALE/* ids need ale-py (it bundles the ROMs): pip install 'rltrans[atari]' "
            "(ale-py and opencv-python-headless)"
        ) from e
    gym.register_envs(ale_py)


def resolve_env_spec(env_id: str) -> tuple[str | None, str, EnvSpec]:
    """Splits ``[module:]EnvId``, imports ``module``, and returns (module, env name, spec).

    Raises ``ValueError`` for an unknown id, suggesting close registered ids.
    """
    module, name = env_id.split(":", 1) if ":" in env_id else (None, env_id)
    if module is not None:
        _import_module_of_id(module, env_id)
    if name.startswith("ALE/") and name not in gym.registry:
        _register_ale()
    if name not in gym.registry:
        ns, base, version = parse_env_id(name)
        # An unversioned id resolves to its latest version, as gymnasium.make does.
        latest = find_highest_version(ns, base) if version is None else None
        if latest is None:
            by_lower = {k.lower(): k for k in gym.registry}
            close = difflib.get_close_matches(name.lower(), list(by_lower), n=5, cutoff=0.6)
            hint = (
                f" Close registered ids: {[by_lower[c] for c in close]}."
                if close
                else " No close match among the registered ids."
            )
            raise ValueError(
                f"unknown environment id {name!r}: it is not registered with Gymnasium.{hint} "
                "For an env from another package use 'module:EnvId' so that the module is "
                "imported (and registers it) first."
            )
        name = get_env_id(ns, base, latest)
    return module, name, gym.spec(name)


def is_ale_spec(name: str, spec: EnvSpec) -> bool:
    """True for Arcade Learning Environment ids (``ALE/...`` or an ale_py entry point)."""
    entry = spec.entry_point
    entry = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
    return name.startswith("ALE/") or entry.startswith("ale_py")


def _import_object(path: str) -> Any:
    """Imports ``package.module.Name`` (or ``package.module:Name``) with errors naming ``path``."""
    module_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"wrapper path {path!r} is not an import path like "
            "'gymnasium.wrappers.TimeAwareObservation'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"wrapper path {path!r}: cannot import module {module_name!r}: {e}"
        ) from e
    if not hasattr(module, attr):
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f" Did you mean {[f'{module_name}.{c}' for c in close]}?" if close else ""
        raise ImportError(f"wrapper path {path!r}: {module_name!r} has no {attr!r}.{hint}")
    return getattr(module, attr)


def resolve_wrappers(
    wrappers: Sequence[Mapping[str, Any]] | None, training: bool | None = None
) -> tuple[tuple[Callable[..., gym.Env], dict[str, Any], str], ...]:
    """Resolves ``[{"path": ..., "kwargs": {...}, "phase": ...}, ...]`` into (callable, kwargs,
    path) triples; ``training`` keeps the entries of that phase (None: every entry).

    Resolved in the calling process so a bad entry fails before any worker starts.
    """
    resolved = []
    for i, entry in enumerate(wrappers or ()):
        if not isinstance(entry, Mapping) or "path" not in entry:
            raise ValueError(
                f"wrappers[{i}] = {entry!r} must be a mapping with keys {list(_WRAPPER_KEYS)} "
                "('kwargs' and 'phase' optional)"
            )
        unknown = sorted(set(entry) - set(_WRAPPER_KEYS))
        if unknown:
            raise ValueError(
                f"wrappers[{i}] has unknown keys {unknown}; valid keys: {list(_WRAPPER_KEYS)}"
            )
        phase = str(entry.get("phase", "both"))
        if phase not in WRAPPER_PHASES:
            raise ValueError(f"wrappers[{i}] phase={phase!r}; valid: {list(WRAPPER_PHASES)}")
        path = str(entry["path"])
        fn = _import_object(path)
        if isinstance(fn, type) and issubclass(fn, (VectorEnv, VectorWrapper)):
            raise ValueError(
                f"wrappers[{i}] {path!r} is a vector wrapper; this list takes single-env "
                "wrappers (e.g. gymnasium.wrappers.* rather than gymnasium.wrappers.vector.*)"
            )
        # Only Wrapper classes: a path from a config (or a checkpoint's config) must never
        # name an arbitrary function to call on the env (builtins.open, shutil.rmtree, ...).
        if not (isinstance(fn, type) and issubclass(fn, gym.Wrapper)):
            raise ValueError(
                f"wrappers[{i}] {path!r} is not a gymnasium.Wrapper subclass; wrappers entries "
                "name single-env wrapper classes such as gymnasium.wrappers.TimeAwareObservation"
            )
        if training is None or phase in ("both", "training" if training else "evaluation"):
            resolved.append((fn, dict(entry.get("kwargs") or {}), path))
    return tuple(resolved)


@dataclass(frozen=True)
class _EnvFactory:
    """Picklable ``() -> gym.Env`` for one sub-env (AsyncVectorEnv may call it in a new process)."""

    module: str | None
    name: str
    env_kwargs: dict[str, Any]
    atari: bool
    training: bool
    wrappers: tuple[tuple[Callable[..., gym.Env], dict[str, Any], str], ...] = field(default=())

    def __call__(self) -> gym.Env:
        if multiprocessing.parent_process() is not None:
            # An async worker: a terminal's Ctrl-C reaches the whole process group, and the
            # trainer finishes its update and checkpoints before it closes the workers.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # A spawned worker has a fresh registry: register the id again before making it.
        if self.module is not None:
            importlib.import_module(self.module)
        if self.name.startswith("ALE/") and self.name not in gym.registry:
            _register_ale()
        env = gym.make(self.name, **self.env_kwargs)
        # First wrapper: statistics of the real game (unclipped reward, game over not life loss).
        env = RecordEpisodeStatistics(env, stats_key=GAME_STATS_KEY)
        if self.atari:
            env = wrap_atari(env, training=self.training)
        for fn, kwargs, path in self.wrappers:
            env = fn(env, **kwargs)
            if not isinstance(env, gym.Env):
                raise TypeError(f"wrapper {path!r} returned {type(env).__name__}, not a gym.Env")
        return env


class GameEpisodeStatistics(VectorWrapper):
    """Adds ``info["episode"] = {"r", "l"}`` and ``info["_episode"]`` at steps where a game ended.

    Reads the sub-envs' :data:`GAME_STATS_KEY` statistics from ``info["final_info"]`` (SAME_STEP:
    the info of the ending step) and from the top-level info (a game that ended inside an
    autoreset, e.g. during the NOOP step of episodic life, reports through the reset info).
    """

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps all envs and lifts per-game statistics to ``info["episode"]``."""
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        n = self.num_envs
        returns, lengths = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        ended = np.zeros(n, dtype=bool)
        for source in (info.get("final_info", {}), info):
            stats, mask = source.get(GAME_STATS_KEY), source.get(f"_{GAME_STATS_KEY}")
            if stats is None or mask is None:
                continue
            mask = np.asarray(mask, dtype=bool)
            returns[mask] = np.asarray(stats["r"])[mask]
            lengths[mask] = np.asarray(stats["l"])[mask]
            ended |= mask
        if ended.any():
            info["episode"] = {"r": returns, "l": lengths}
            info["_episode"] = ended
        return obs, rewards, terminations, truncations, info


class SeedFirstReset(VectorWrapper):
    """Uses ``seed`` for the first ``reset()`` that passes none (sub-env i gets ``seed + i``)."""

    def __init__(self, env: VectorEnv, seed: int) -> None:
        super().__init__(env)
        self._pending_seed: int | None = seed
        env.action_space.seed(seed)
        env.single_action_space.seed(seed)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets, seeding from the construction ``seed`` the first time."""
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


def make_vector_env(
    env_id: str,
    num_envs: int,
    vectorization: Literal["sync", "async"] = "sync",
    wrappers: Sequence[Mapping[str, Any]] | None = None,
    seed: int | None = None,
    atari: Literal["auto", "on", "off"] = "auto",
    training: bool = True,
    env_kwargs: Mapping[str, Any] | None = None,
) -> VectorEnv:
    """Makes ``num_envs`` copies of a registered Gymnasium env as one SAME_STEP vector env.

    ``env_id`` may be ``"module:EnvId"`` (the module is imported first so it registers the id).
    ``wrappers`` are single-env wrappers ``{"path": import path, "kwargs": {...}, "phase":
    "both" | "training" | "evaluation"}`` applied in order after the Atari preprocessing, to
    the envs of their phase (default both). ``atari="auto"`` preprocesses ALE ids (see
    :mod:`rltrans.envs.atari`); ``training`` picks its training or evaluation form.
    ``env_kwargs`` go to ``gymnasium.make``. See the module docstring for the info contract.

    Example::

        envs = make_vector_env("CartPole-v1", num_envs=8, seed=1)
        obs, info = envs.reset()
        obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
    """
    if vectorization not in _VECTORIZATIONS:
        raise ValueError(f"vectorization={vectorization!r}; valid: {list(_VECTORIZATIONS)}")
    if atari not in _ATARI_MODES:
        raise ValueError(f"atari={atari!r}; valid: {list(_ATARI_MODES)}")
    if num_envs < 1:
        raise ValueError(f"num_envs={num_envs} must be >= 1")
    module, name, spec = resolve_env_spec(env_id)
    kwargs = dict(env_kwargs or {})
    use_atari = atari == "on" or (atari == "auto" and is_ale_spec(name, spec))
    if use_atari:
        if kwargs.get("frameskip", 1) != 1:
            raise ValueError(
                f"env_kwargs frameskip={kwargs['frameskip']!r} with Atari preprocessing would skip "
                "frames twice; the preprocessing skips 4 frames itself (leave frameskip unset)"
            )
        if is_ale_spec(name, spec):
            kwargs["frameskip"] = 1  # ALE/*-v5 defaults to 4
    wrap = resolve_wrappers(wrappers, training)
    factory = _EnvFactory(module, name, kwargs, use_atari, training, wrap)
    vector_cls = SyncVectorEnv if vectorization == "sync" else AsyncVectorEnv
    # The constructors, not gym.make_vec: make_vec prefers an env's own vector entry point
    # (CartPoleVectorEnv, ale_py's AtariVectorEnv), which would bypass the wrappers above.
    envs: VectorEnv = vector_cls([factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = GameEpisodeStatistics(envs)
    if seed is not None:
        envs = SeedFirstReset(envs, seed)
    return envs


def close_envs(envs: VectorEnv, *, cut_short: bool = False) -> None:
    """Close ``envs``; ``cut_short``: after a signal, which may have cut one of its calls short.
    Then an async vector env's workers are terminated, not asked to close: the signal may have
    stopped the main process between sending a step to some workers and reading their replies,
    or in the middle of reading one (the pipe then never yields a whole message), and
    Gymnasium's close would wait for that step forever."""
    base = envs.unwrapped
    if cut_short and isinstance(base, AsyncVectorEnv) and not base.closed:
        for process in base.processes:
            if process.is_alive():
                process.terminate()
        for process in base.processes:
            process.join()
        for pipe in base.parent_pipes:
            if pipe is not None:
                pipe.close()
        base.closed = True
    envs.close()
