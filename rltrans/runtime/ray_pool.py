"""Ray actors for asynchronous learners (IMPALA's ``runtime=ray``).

:class:`RayPool` runs ``num_actors`` Ray actors (:class:`RolloutWorker`, made remote inside
the pool); each builds its env (``make_env``) and agent (``build_agent``) from the plain
configs and acts with :class:`~rltrans.runtime.actors.LocalActor` (so the one acting loop is
reused). A rollout comes back as the return value of one actor call: a dict of CPU NumPy
arrays (observation tree, actions, log-probs, values, rewards, flags, the T/L segment
memories, the bootstrap value) plus the version of the weights that acted, the episode
statistics of its steps and the actor's timings. The learner takes finished rollouts with
:meth:`RayPool.get`; each is a fresh, writable copy, so :meth:`RayPool.release` does nothing.

Design:

* Ray is optional (``pip install "rltrans[ray]"``): this module imports it only inside
  functions, so importing it (or the trainer) never needs Ray.
* The Ray instance: ``address=None`` starts a local one (``num_cpus`` = what the actors ask,
  at least 1; no dashboard; an object store of ``object_store_memory`` bytes) and
  :meth:`RayPool.close` shuts it down. ``address="auto"`` / ``"host:port"`` /
  ``"ray://host:port"`` joins an existing cluster, which the pool never shuts down (every node
  needs rltrans and the env's packages installed). If Ray is already initialized in this
  process, the pool uses that instance and leaves it running.
* A locally started instance keeps Ray's defaults for authentication (recent Ray turns token
  authentication on; ``RAY_AUTH_MODE`` decides); only Ray's warning that it did so is muted.
  Before starting it the pool checks that the loopback interface accepts connections:
  without it ``ray.init`` waits forever.
* In flight: each actor has ``rollouts_in_flight`` rollout calls queued (default 2: it acts
  its next rollout while the learner trains on the last). :meth:`RayPool.get` waits
  (``ray.wait``) for the oldest finished call of any actor and at once queues that actor's
  next call with the newest weights. A call acts with the weights newest when it was queued
  (not when it starts, as in ProcessPool), so the policy lag is about
  ``num_actors x rollouts_in_flight`` rollouts; ``rollouts_in_flight=1`` halves it, at the
  cost of actors idling while the learner trains.
* Weights: :meth:`RayPool.publish` puts one CPU copy of the state_dict in Ray's object store
  (``ray.put``) and every later call passes that reference wrapped in a list (so Ray does
  not fetch it for each call) with its version; an actor fetches and loads the weights only
  when the version moved. ``LocalActor.collect`` then calls ``agent.refresh_state``.
* Seeds: actor i resets its envs and seeds its RNGs with ``actor_seed(seed, i, N)`` of
  :mod:`rltrans.runtime.pool` (as LocalPool's and ProcessPool's actors); one actor with the
  learner's weights repeats a LocalActor of this process exactly.
* Order: Ray runs the calls of one caller to one actor in order, so :meth:`restart_envs`
  applies after the rollouts already queued (as in ProcessPool).
* Failures: a call that raises (the actor died: ``RayActorError``; or its code raised) gets
  the actor a one-line warning on stderr naming it, then a new actor with a new seed (up to
  ``max_restarts`` per actor, then RuntimeError); its other queued calls are lost (counted).
  An actor whose code raises before the first rollout it ever delivers fails the pool (a bad
  config, not bad luck), with the actor's error.

Rewards are stored as the env returned them: reward scaling, if any, is the learner's.
Episode statistics travel with each rollout (the info keys EpisodeTracker reads) to the
pool's ``on_info``, called in :meth:`RayPool.get` before it returns that rollout.

Example:
    >>> with RayPool(agent_cfg, env_cfg, num_actors=2, num_steps=64, segment_length=16,
    ...              seed=0) as pool:                                 # doctest: +SKIP
    ...     pool.publish(agent.state_dict(), 0)
    ...     rollout = pool.get()
    ...     learner.update([rollout.buffer], [rollout.bootstrap_value])
    ...     pool.release(rollout)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rltrans.config import ConfigError
from rltrans.runtime.pool import (
    PoolStats,
    Rollout,
    actor_seed,
    plain,
    pool_arguments,
    restart_seed,
)
from rltrans.runtime.process import BOOL_FIELDS, FLOAT_FIELDS, buffer_from_views, episode_info
from rltrans.types import tree_map

INSTALL_HINT = 'pip install "rltrans[ray]" (in a checkout: pip install -e ".[ray]")'
DEFAULT_OBJECT_STORE_MEMORY = 256 * 2**20  # bytes; Ray needs at least 75 MiB
ROLLOUT_KEYS = ("obs", "actions", "memories", "bootstrap_value", *FLOAT_FIELDS, *BOOL_FIELDS)


class RayNotInstalledError(ConfigError, ImportError):
    """``runtime=ray`` without Ray: a ConfigError for the CLI, an ImportError for code."""


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayNotInstalledError` saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise RayNotInstalledError(f"runtime=ray needs Ray: {INSTALL_HINT} ({err})") from None
    return ray


def _check_loopback(timeout: float = 2.0) -> None:
    """Raise when this machine's loopback interface refuses a TCP connection: a local Ray
    instance talks to itself through it, and ``ray.init`` would wait forever."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=timeout):
                pass
    except OSError as err:
        raise RuntimeError(
            f"runtime=ray: cannot start a local Ray instance: the loopback interface "
            f"(127.0.0.1) refuses connections ({err}); ray.init would hang. Bring it up "
            f"(ip link set lo up) or join a cluster with runtime.address"
        ) from None


def init_ray(
    address: str | None,
    *,
    num_cpus: int,
    object_store_memory: int | None = DEFAULT_OBJECT_STORE_MEMORY,
    log_to_driver: bool = True,
) -> bool:
    """Make Ray ready in this process; True when this call started a local instance (its
    caller then owns it and shuts it down). An instance already initialized is used as is;
    ``address`` joins a cluster (never started nor stopped here)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": log_to_driver, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **quiet)
        return False
    _check_loopback()
    # Recent Ray turns token authentication on for a new local instance and warns that it
    # did: keep it on, without the warning. (Setting RAY_AUTH_MODE=token says the same, but
    # only before ray is imported: set later, the driver and Ray's servers disagree.)
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    try:
        ray.init(
            num_cpus=max(1, int(num_cpus)),
            include_dashboard=False,
            object_store_memory=object_store_memory,
            **quiet,
        )
    finally:
        auth_log.setLevel(level)
    return True


# ----------------------------------------------------------------------------- tree <-> host


def _map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf of nested dicts, named tuples, tuples and lists."""
    if isinstance(tree, Mapping):
        return {k: _map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_map_leaves(fn, v) for v in tree))
    if isinstance(tree, tuple | list):
        return type(tree)(_map_leaves(fn, v) for v in tree)
    return fn(tree)


def to_host(tree: Any) -> Any:
    """CPU NumPy arrays for the tensors of a tree (Ray sends large arrays without pickling
    them); tensors NumPy has no dtype for (bfloat16) stay tensors. Arrays may share memory
    with the tensors: Ray copies a return value or ``ray.put`` argument at once."""

    def host(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        x = x.detach().cpu()
        try:
            return x.numpy()
        except TypeError:
            return x

    return _map_leaves(host, tree)


def to_torch(tree: Any, copy: bool = True) -> Any:
    """Tensors for the NumPy arrays of a tree; with ``copy``, writable copies wherever the
    array is read-only (it views Ray's object store)."""

    def torch_leaf(x: Any) -> Any:
        if not isinstance(x, np.ndarray):
            return x
        if not x.flags.writeable:
            if not copy:  # read only by the caller (load_state_dict copies)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    return torch.from_numpy(x)
            x = x.copy()
        return torch.from_numpy(x)

    return _map_leaves(torch_leaf, tree)


# ----------------------------------------------------------------------------- the Ray actor


class RolloutWorker:
    """One actor: its env, its agent and a :class:`LocalActor` over them, in a Ray worker
    process (the pool makes this class remote; it is a plain class, usable in-process)."""

    def __init__(
        self,
        actor_id: int,
        seed: int,
        agent_cfg: dict,
        env_cfg: dict,
        num_steps: int,
        segment_length: int,
        torch_threads: int = 1,
    ) -> None:
        from rltrans.buffers.rollout import RolloutBuffer
        from rltrans.envs import make_env
        from rltrans.registry import build_agent
        from rltrans.run import seed_everything, set_threads
        from rltrans.runtime.actors import LocalActor

        set_threads(torch_threads)
        self.actor_id = actor_id
        self.envs = make_env(env_cfg, seed=seed, device="cpu")
        space, action_space = self.envs.single_observation_space, self.envs.single_action_space
        self.agent = build_agent(agent_cfg, space, action_space)
        seed_everything(seed)
        self.actor = LocalActor(self.envs, self.agent, seed=seed, device="cpu")
        self.buffer = RolloutBuffer(num_steps, self.envs.num_envs, segment_length, "cpu")
        self.version = -1  # of the weights loaded; -1 = the agent's initial ones
        self.idle_since: float | None = None  # when the last rollout call returned

    def ready(self) -> tuple[int, int]:
        """(pid, num_envs) once built."""
        return os.getpid(), int(self.envs.num_envs)

    def _load(self, state_dict: Mapping[str, Any]) -> None:
        state = to_torch(dict(state_dict), copy=False)
        missing = [k for k in self.agent.state_dict() if k not in state]
        if missing:
            raise KeyError(f"published state_dict lacks {missing[:5]} (the actor's agent has them)")
        self.agent.load_state_dict(state, strict=False)

    def rollout(self, weights: list, version: int) -> dict[str, Any]:
        """Load ``weights[0]`` (an object ref) unless ``version`` is loaded, act one rollout
        and return it as NumPy arrays with its version, episode infos and timings."""
        start = time.perf_counter()
        wait_s = 0.0 if self.idle_since is None else start - self.idle_since
        if version != self.version:
            import ray

            self._load(ray.get(weights[0]))
            self.version = version
        self.actor.set_policy_version(version)
        infos: list[dict[str, Any]] = []

        def record_episodes(info: dict) -> None:
            kept = episode_info(info)
            if kept is not None:
                infos.append(kept)

        buffer = self.buffer
        self.actor.collect(buffer, on_info=record_episodes)
        out = {name: getattr(buffer, name) for name in ("obs", "actions", *FLOAT_FIELDS)}
        out.update({name: getattr(buffer, name) for name in BOOL_FIELDS})
        out["memories"] = list(buffer.memories)
        out["bootstrap_value"] = self.actor.bootstrap_value()
        out = to_host(out)
        out.update(
            policy_version=int(version),
            infos=infos,
            timings=self.actor.pop_timings(),
            wait_s=wait_s,
            pid=os.getpid(),
        )
        self.idle_since = time.perf_counter()
        return out

    def restart(self, seed: int) -> None:
        """Fresh episodes and memory from the next rollout on (``LocalActor.restart``)."""
        self.actor.restart(seed=seed)


# ----------------------------------------------------------------------------- the pool


@dataclass
class _Worker:
    handle: Any  # the Ray actor handle
    seed: int  # base seed: restarts derive theirs from it
    incarnation: int = 0
    delivered: int = 0  # rollouts this incarnation delivered
    pid: int | None = None


class RayPool:
    """``num_actors`` Ray actors feeding a learner through Ray's object store.

    Implements the ``ActorPool`` protocol of :mod:`rltrans.runtime.pool`. The learner must
    :meth:`publish` its weights (version 0) before the first :meth:`get`: the actors' first
    calls go out then. A rollout's tensors are the learner's own (writable, on ``device``).
    Actor i resets its envs and seeds its RNGs with ``actor_seed(seed, i, num_envs)``.
    ``on_info(info)`` sees, in this process before :meth:`get` returns a rollout, the episode
    statistics of each step of it where an episode ended.

    Args:
        address: None starts a local Ray instance (shut down by :meth:`close`); a string
            (``"auto"``, ``"host:port"``, ``"ray://host:port"``) joins that cluster and leaves
            it running. An instance already initialized in this process is used as is.
        num_cpus_per_actor: Ray CPUs each actor reserves (may be fractional, e.g. 0.5 to pack
            two actors per CPU); a local instance gets ``ceil(num_actors x this)`` CPUs.
        rollouts_in_flight: rollout calls queued per actor (>= 1; 2 = one acted while the
            learner trains on the other). More hides slower learner steps but adds lag.
        object_store_memory: bytes of Ray's shared-memory object store of a local instance
            (None = Ray's default, 30 % of the memory). It holds the rollouts in flight
            (``num_actors x rollouts_in_flight`` of them) and a few weight copies; Ray
            spills to disk beyond it.
        log_to_driver: print the actors' stdout and stderr here (Ray prefixes each line with
            the actor's name and pid).
        start_timeout: seconds to wait for the actors to be built (a cluster without the
            CPUs asked never schedules them) before raising.
    """

    def __init__(
        self,
        agent_cfg: Mapping[str, Any],
        env_cfg: Mapping[str, Any],
        *,
        num_actors: int,
        num_steps: int,
        segment_length: int,
        seed: int,
        torch_threads: int = 1,
        max_restarts: int = 10,
        device: torch.device | str = "cpu",
        on_info: Callable[[dict[str, Any]], Any] | None = None,
        address: str | None = None,
        num_cpus_per_actor: float = 1,
        rollouts_in_flight: int = 2,
        object_store_memory: int | None = DEFAULT_OBJECT_STORE_MEMORY,
        log_to_driver: bool = True,
        start_timeout: float = 300.0,
    ) -> None:

        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        if rollouts_in_flight < 1:
            raise ValueError(f"rollouts_in_flight must be >= 1, got {rollouts_in_flight}")
        if num_cpus_per_actor < 0:
            raise ValueError(f"num_cpus_per_actor must be >= 0, got {num_cpus_per_actor}")
        if segment_length < 1 or num_steps % segment_length:
            raise ValueError(f"num_steps={num_steps} must be a multiple of segment_length")
        self.agent_cfg, self.env_cfg = plain(agent_cfg), plain(env_cfg)
        self.num_actors, self.num_steps, self.segment_length = num_actors, num_steps, segment_length
        self.seed, self.max_restarts, self.torch_threads = seed, max_restarts, torch_threads
        self.device, self.on_info = torch.device(device), on_info
        self.address, self.num_cpus_per_actor = address, num_cpus_per_actor
        self.rollouts_in_flight = rollouts_in_flight
        self._closed = True  # until Ray is up
        self._ray = import_ray()
        self._owns_ray = init_ray(
            address,
            num_cpus=math.ceil(num_actors * num_cpus_per_actor),
            object_store_memory=object_store_memory,
            log_to_driver=log_to_driver,
        )
        self._closed = False
        atexit.register(self.close)
        self._remote = self._ray.remote(num_cpus=num_cpus_per_actor)(RolloutWorker)
        self._weights: list | None = None  # [object ref of the newest state_dict]
        self._published = -1
        self._inflight: dict[Any, int] = {}  # rollout call ref -> actor, in submission order
        self._stats = PoolStats("lost")
        t0 = time.perf_counter()
        try:
            self.num_envs = int(self.env_cfg.get("num_envs") or 1)  # envs per rollout (N)
            self._workers: list[_Worker] = []
            for i in range(num_actors):
                base = actor_seed(seed, i, self.num_envs)
                self._workers.append(_Worker(self._new_actor(i, base), base))
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0  # actors built (in parallel)

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        agent: torch.nn.Module | None = None,
        *,
        seed: int,
        device: torch.device | str = "cpu",
        on_info: Callable[[dict[str, Any]], Any] | None = None,
    ) -> RayPool:
        """The pool a training config describes (``runtime``, ``algo``, ``env``, ``agent``,
        ``torch_threads``). Dropping stale rollouts is left to the trainer; ``agent`` is not
        needed (the trainer publishes its weights)."""
        env_cfg, shared, runtime = pool_arguments(cfg)
        address = runtime.get("address")
        store = runtime.get("object_store_memory", DEFAULT_OBJECT_STORE_MEMORY)
        return cls(
            cfg.agent,
            env_cfg,
            **shared,
            seed=seed,
            device=device,
            on_info=on_info,
            address=None if address is None else str(address),
            num_cpus_per_actor=float(runtime.get("num_cpus_per_actor", 1)),
            rollouts_in_flight=int(runtime.get("rollouts_in_flight", 2)),
            object_store_memory=None if store is None else int(store),
        )

    # -- set-up

    def _new_actor(self, i: int, seed: int) -> Any:
        return self._remote.remote(
            i,
            seed,
            self.agent_cfg,
            self.env_cfg,
            self.num_steps,
            self.segment_length,
            self.torch_threads,
        )

    def _wait_ready(self, timeout: float) -> None:
        """Block until every actor is built; fail with the first actor's error."""
        ray = self._ray
        refs = {w.handle.ready.remote(): i for i, w in enumerate(self._workers)}
        deadline = time.monotonic() + timeout
        while refs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"runtime=ray: {len(refs)} of {self.num_actors} actors not built within "
                    f"{timeout:.0f} s (each asks {self.num_cpus_per_actor} CPU; the cluster "
                    f"has {ray.available_resources().get('CPU', 0)} free)"
                )
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=min(left, 1.0))
            for ref in ready:
                i = refs.pop(ref)
                try:
                    pid, num_envs = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise RuntimeError(
                        f"runtime=ray: actor {i} failed while starting: {err}"
                    ) from None
                self._workers[i].pid = pid
                if num_envs != self.num_envs:  # the seeds assumed env.num_envs
                    raise RuntimeError(
                        f"actor {i} has {num_envs} envs, its env config {self.num_envs}"
                    )

    def _submit(self, i: int) -> None:
        """Queue one rollout call of actor ``i`` with the newest weights."""
        ref = self._workers[i].handle.rollout.remote(self._weights, self._published)
        self._inflight[ref] = i

    # -- the learner side

    def publish(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Make ``state_dict`` the weights of every rollout call queued from now on (one
        CPU copy in the object store); the first publish queues the actors' first calls."""
        if self._closed:
            raise RuntimeError("RayPool is closed")
        first = self._weights is None
        self._weights = [self._ray.put(to_host(dict(state_dict)))]
        self._published = int(version)
        if first:
            for _ in range(self.rollouts_in_flight):
                for i in range(self.num_actors):
                    self._submit(i)

    def get(self, timeout: float | None = None) -> Rollout:
        """The oldest finished rollout of any actor (blocks; ``timeout`` seconds raise
        TimeoutError); that actor's next call is queued at once with the newest weights."""
        if self._closed:
            raise RuntimeError("RayPool is closed")
        if self._weights is None:
            raise RuntimeError("publish() the weights before get(): the actors act with them")
        ray, start = self._ray, time.perf_counter()
        try:
            while True:
                wait = 1.0
                if timeout is not None:
                    wait = min(wait, start + timeout - time.perf_counter())
                    if wait <= 0:
                        raise TimeoutError(f"no rollout within {timeout} s")
                ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=wait)
                if not ready:
                    continue
                ref = ready[0]
                i = self._inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as err:
                    self._restart_failed(i, err)
                    continue
                self._submit(i)
                self._stats.times["queue_wait_s"] += time.perf_counter() - start
                return self._rollout(i, out)
        except KeyboardInterrupt:
            self.close()
            raise

    def _rollout(self, i: int, out: dict[str, Any]) -> Rollout:
        worker, version = self._workers[i], int(out["policy_version"])
        worker.delivered += 1
        worker.pid = out.get("pid", worker.pid)
        if self.on_info is not None:
            for info in out["infos"]:
                self.on_info(info)
        lag = self._published - version
        self._stats.delivered(lag)
        self._stats.times["actor_wait_s"] += out["wait_s"]
        self._stats.times["env_s"] += out["timings"]["env"]
        self._stats.times["act_s"] += out["timings"]["act"]
        views = to_torch({k: out[k] for k in ROLLOUT_KEYS})
        if self.device.type != "cpu":
            views = tree_map(lambda t: t.to(self.device, non_blocking=True), views)
        buffer = buffer_from_views(views, self.num_steps, self.segment_length)
        buffer.device = self.device
        buffer.policy_version = version
        return Rollout(buffer, views["bootstrap_value"], version, i)

    def release(self, rollout: Rollout) -> None:
        """Nothing to hand back: every rollout is the learner's own copy."""

    def _restart_failed(self, i: int, err: BaseException) -> None:
        """Replace actor ``i``, whose call raised ``err``; its other queued calls are lost."""
        ray, worker = self._ray, self._workers[i]
        lost = [ref for ref, j in self._inflight.items() if j == i]
        for ref in lost:
            del self._inflight[ref]
        self._stats.counts["lost"] += len(lost)
        with contextlib.suppress(Exception):
            ray.kill(worker.handle)
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        reason = f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]
        died = isinstance(err, ray.exceptions.RayActorError)
        if not died and worker.incarnation == 0 and worker.delivered == 0:
            self.close()
            raise RuntimeError(f"runtime=ray: actor {i} failed before its first rollout: {err}")
        try:
            seed = restart_seed(
                self._stats,
                i,
                base_seed=worker.seed,
                incarnation=worker.incarnation,
                max_restarts=self.max_restarts,
                pid=worker.pid,
                why=f"with {reason}",
            )
        except RuntimeError:
            self.close()
            raise
        self._workers[i] = _Worker(self._new_actor(i, seed), worker.seed, worker.incarnation + 1)
        for _ in range(self.rollouts_in_flight):
            self._submit(i)

    # -- control and statistics

    def restart_envs(self, seed: int) -> None:
        """Every actor restarts its episodes with ``actor_seed(seed, actor_id, num_envs)``
        after the rollout calls already queued (those are still delivered)."""
        for i, worker in enumerate(self._workers):
            worker.seed = actor_seed(seed, i, self.num_envs)
            worker.handle.restart.remote(worker.seed)

    def stats(self) -> dict[str, float]:
        """Counts since the start: ``restarts`` (= ``actor_restarts``), ``dropped`` (always 0:
        stale rollouts are the trainer's to drop), ``lost`` (calls of dead actors), ``rollouts``
        (delivered). Since the last call: ``queue_wait_ms`` (the learner waiting in get),
        ``actor_wait_ms`` (actors idle between calls, summed), ``env_ms`` and ``act_ms``
        (summed over actors), ``policy_lag_mean``/``_max`` and ``policy_lag_hist/<lag>``."""
        return self._stats.report()

    @property
    def handles(self) -> list[Any]:
        """The actors' Ray handles (actor i at index i)."""
        return [w.handle for w in getattr(self, "_workers", [])]

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the actors (None until an actor is known to be built)."""
        return [w.pid for w in getattr(self, "_workers", [])]

    def close(self) -> None:
        """Kill the actors; shut Ray down if this pool started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        ray = self._ray
        self._inflight.clear()
        self._weights = None
        if ray.is_initialized():
            for worker in getattr(self, "_workers", []):
                with contextlib.suppress(Exception):
                    ray.kill(worker.handle)
            if self._owns_ray:
                ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()
