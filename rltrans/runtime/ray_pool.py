"""Ray actors for asynchronous learners (IMPALA's ``runtime=ray``).

:class:`RayPool` runs ``num_actors`` Ray actors (:class:`RolloutWorker`), each a
:class:`~rltrans.runtime.remote.RemoteActor`; what it shares with the process pool (slots,
wire format, restarts, closing, ``from_config``) is :class:`~rltrans.runtime.remote.RemotePool`,
and this module holds the transport. A rollout is the return value of one actor call (CPU
NumPy arrays, the weights' version, episode statistics, timings); :meth:`RayPool.get` hands
over a fresh copy, so :meth:`RayPool.release` does nothing.

* Ray is optional and imported only inside functions. ``address=None`` starts a local
  instance (no dashboard, Ray's own authentication defaults, the loopback checked first:
  without it ``ray.init`` waits forever) that :meth:`RayPool.close` shuts down; an address
  joins a cluster the pool never shuts down; an instance already running is used as is.
* Each actor has ``rollouts_in_flight`` calls queued (default 2). A call acts with the
  weights newest when it was queued, so the policy lag is about ``num_actors x
  rollouts_in_flight`` rollouts; 1 halves it at the cost of idle actors.
* :meth:`RayPool.publish` puts one copy of the weights in the object store; actors load it
  only when the version moved. Actor i seeds with ``actor_seed(seed, i, N)``, so one actor
  repeats a LocalActor exactly; Ray keeps one caller's calls to an actor in order, so
  :meth:`RayPool.restart_envs` applies after the rollouts already queued.
* Ctrl-C reaches only the learner (the actors ignore SIGINT), which checkpoints, then stops
  them. A failed call warns on stderr and restarts its actor with a new seed (up to
  ``max_restarts``; its other queued calls are lost, counted); an actor that fails before
  its first rollout fails the pool (a bad config, not bad luck).

Rewards are stored as the env returned them (scaling is the learner's); episode statistics
reach the pool's ``on_info`` in :meth:`RayPool.get`, before their rollout.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import ConfigError
from rltrans.runtime.pool import Rollout
from rltrans.runtime.remote import (
    ROLLOUT_KEYS,
    ActorSlot,
    ActorSpec,
    RemoteActor,
    RemotePool,
    ignore_interrupts,
    map_leaves,
    rollout_tensors,
    to_host,
)

INSTALL_HINT = 'pip install "rltrans[ray]" (in a checkout: pip install -e ".[ray]")'
DEFAULT_OBJECT_STORE_MEMORY = 256 * 2**20  # bytes; Ray needs at least 75 MiB


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


# ----------------------------------------------------------------------------- the Ray actor


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

    return map_leaves(torch_leaf, tree)


class RolloutWorker(RemoteActor):
    """One actor in a Ray worker process (the pool makes this class remote; it is a plain
    class, usable in-process): a started :class:`~rltrans.runtime.remote.RemoteActor` and the
    buffer it fills. ``own_process``: it runs in a process of its own, which then ignores
    SIGINT (the learner stops it)."""

    def __init__(
        self, actor_id: int, seed: int, spec: ActorSpec, *, own_process: bool = False
    ) -> None:
        if own_process:
            ignore_interrupts()
        super().__init__(spec, seed)
        self.start()
        self.actor_id = actor_id
        self.buffer = RolloutBuffer(spec.num_steps, self.envs.num_envs, spec.segment_length, "cpu")
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
        bootstrap_value, infos, timings = self.collect(self.buffer, version)
        out = to_host(rollout_tensors(self.buffer, bootstrap_value))
        out.update(
            policy_version=int(version),
            infos=infos,
            timings=timings,
            wait_s=wait_s,
            pid=os.getpid(),
        )
        self.idle_since = time.perf_counter()
        return out


# ----------------------------------------------------------------------------- the pool


@dataclass(kw_only=True)
class _Worker(ActorSlot):
    handle: Any  # the Ray actor handle
    delivered: int = 0  # rollouts this incarnation delivered


class RayPool(RemotePool):
    """``num_actors`` Ray actors feeding a learner through Ray's object store.

    A :class:`~rltrans.runtime.remote.RemotePool` (its keywords: ``num_actors``,
    ``num_steps``, ``segment_length``, ``seed``, ``torch_threads``, ``max_restarts``,
    ``device``, ``on_info``): the actors' first calls go out with the first :meth:`publish`.
    A rollout's tensors are the learner's own (writable, on ``device``). Stale rollouts are
    the caller's to drop.

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

    :meth:`stats` adds ``lost``: rollout calls of dead actors.
    """

    counts = ("lost",)
    poll_s = 1.0

    def __init__(
        self,
        agent_cfg: Mapping[str, Any],
        env_cfg: Mapping[str, Any],
        *,
        address: str | None = None,
        num_cpus_per_actor: float = 1,
        rollouts_in_flight: int = 2,
        object_store_memory: int | None = DEFAULT_OBJECT_STORE_MEMORY,
        log_to_driver: bool = True,
        start_timeout: float = 300.0,
        **common: Any,
    ) -> None:
        if rollouts_in_flight < 1:
            raise ValueError(f"rollouts_in_flight must be >= 1, got {rollouts_in_flight}")
        if num_cpus_per_actor < 0:
            raise ValueError(f"num_cpus_per_actor must be >= 0, got {num_cpus_per_actor}")
        super().__init__(agent_cfg, env_cfg, **common)
        self.address, self.num_cpus_per_actor = address, num_cpus_per_actor
        self.rollouts_in_flight = rollouts_in_flight
        self.num_envs = int(self.env_cfg.get("num_envs") or 1)  # envs per rollout (N)
        self._weights: list | None = None  # [object ref of the newest state_dict]
        self._inflight: dict[Any, int] = {}  # rollout call ref -> actor, in submission order
        self._ready: deque[tuple[int, dict[str, Any]]] = deque()  # actor, rollout received
        self._ray = import_ray()
        self._owns_ray = init_ray(
            address,
            num_cpus=math.ceil(self.num_actors * num_cpus_per_actor),
            object_store_memory=object_store_memory,
            log_to_driver=log_to_driver,
        )
        self._remote = self._ray.remote(num_cpus=num_cpus_per_actor)(RolloutWorker)
        t0 = time.perf_counter()
        self._start_all()
        with self._closing_on_error():
            self._wait_ready(start_timeout)
        self.start_s = time.perf_counter() - t0  # actors built (in parallel)

    @classmethod
    def _options(cls, runtime: Mapping[str, Any]) -> dict[str, Any]:
        address = runtime.get("address")
        store = runtime.get("object_store_memory", DEFAULT_OBJECT_STORE_MEMORY)
        return {
            "address": None if address is None else str(address),
            "num_cpus_per_actor": float(runtime.get("num_cpus_per_actor", 1)),
            "rollouts_in_flight": int(runtime.get("rollouts_in_flight", 2)),
            "object_store_memory": None if store is None else int(store),
        }

    # -- set-up

    def _launch(self, i: int, seed: int, incarnation: int = 0) -> _Worker:
        handle = self._remote.remote(i, seed, self._spec, own_process=True)
        return _Worker(seed=seed, incarnation=incarnation, handle=handle)

    def _wait_ready(self, timeout: float) -> None:
        """Block until every actor is built; fail with the first actor's error."""
        ray = self._ray
        refs = {w.handle.ready.remote(): i for i, w in enumerate(self._actors)}
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
                self._actors[i].pid = pid
                if num_envs != self.num_envs:  # the seeds assumed env.num_envs
                    raise RuntimeError(
                        f"actor {i} has {num_envs} envs, its env config {self.num_envs}"
                    )

    def _submit(self, i: int) -> None:
        """Queue one rollout call of actor ``i`` with the newest weights."""
        ref = self._actors[i].handle.rollout.remote(self._weights, self._published)
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

    def _poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the oldest finished call of any actor; queue that
        actor's next call at once with the newest weights (or replace it if it failed)."""
        ray = self._ray
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=timeout)
        for ref in ready:
            i = self._inflight.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayError as err:
                self._restart_failed(i, err)
                continue
            worker = self._actors[i]
            worker.delivered += 1
            worker.pid = out.get("pid", worker.pid)
            self._stats.acted(out["timings"], out["wait_s"])
            self._submit(i)
            self._ready.append((i, out))

    def _take(self) -> Rollout | None:
        if not self._ready:
            return None
        i, out = self._ready.popleft()
        views = to_torch({k: out[k] for k in ROLLOUT_KEYS})
        return self._deliver(i, views, int(out["policy_version"]), out["infos"])

    def release(self, rollout: Rollout) -> None:
        """Nothing to hand back: every rollout is the learner's own copy."""

    def _restart_failed(self, i: int, err: BaseException) -> None:
        """Replace actor ``i``, whose call raised ``err``; its other queued calls are lost."""
        ray, worker = self._ray, self._actors[i]
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
            self._fail(f"runtime=ray: actor {i} failed before its first rollout: {err}")
        self._restart(i, worker, f"with {reason}")
        for _ in range(self.rollouts_in_flight):
            self._submit(i)

    # -- control

    def _send_restart(self, actor: _Worker) -> None:
        actor.handle.restart.remote(actor.seed)  # Ray runs it after the calls already queued

    @property
    def handles(self) -> list[Any]:
        """The actors' Ray handles (actor i at index i; None once closed)."""
        return [None if w is None else w.handle for w in self._actors]

    def _stop(self, actors: list[_Worker]) -> None:
        """Kill the actors; shut Ray down if this pool started it."""
        ray = self._ray
        self._inflight.clear()
        self._weights = None
        if ray.is_initialized():
            for worker in actors:
                with contextlib.suppress(Exception):
                    ray.kill(worker.handle)
            if self._owns_ray:
                ray.shutdown()
