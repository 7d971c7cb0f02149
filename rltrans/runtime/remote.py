"""What the actor pools whose actors live in other processes share, whatever the transport.

:class:`~rltrans.runtime.process.ProcessPool` (pipes and shared memory) and
:class:`~rltrans.runtime.ray_pool.RayPool` (Ray actors and its object store) differ only in
how weights reach an actor and how a rollout comes back. Everything else is here, once:

* The wire format of a rollout: the tensors :data:`ROLLOUT_KEYS` names
  (:func:`rollout_tensors`, and back to a buffer with :func:`buffer_from_views`), and the
  episode statistics of its steps (:func:`episode_info`), host copies (:func:`to_host`).
* The actor's side: :class:`RemoteActor` builds env and agent from the plain configs and acts
  with :class:`~rltrans.runtime.actors.LocalActor` (the one acting loop), so one remote actor
  with the learner's weights repeats a LocalActor of the learner's process exactly. Its
  process ignores SIGINT (:func:`ignore_interrupts`): Ctrl-C in a terminal signals the whole
  process group, and the learner, which finishes its update and checkpoints first, stops
  its actors itself.
* The pool's side: :class:`RemotePool` keeps one :class:`ActorSlot` per actor (its base seed,
  incarnation and pid), starts actor i with ``actor_seed(seed, i, N)``, turns what an actor
  sent into a :class:`~rltrans.runtime.pool.Rollout` (episode statistics to ``on_info``,
  policy lag counted, stale rollouts dropped past ``max_policy_lag``), restarts a dead actor
  with a new seed up to ``max_restarts`` times, closes on failure and at exit, and builds
  itself from a training config (:meth:`RemotePool.from_config`).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import Tensor

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.runtime.pool import Rollout, actor_seed, plain, pool_arguments
from rltrans.types import Tree, tree_map

if TYPE_CHECKING:
    from typing_extensions import Self

    from rltrans.runtime.actors import LocalActor

FLOAT_FIELDS = ("log_probs", "values", "rewards", "final_values")
BOOL_FIELDS = ("terminated", "truncated", "starts")
# The tensors of one rollout on the wire, in this order (a process pool's slot layout).
ROLLOUT_KEYS = ("obs", "actions", "memories", "bootstrap_value", *FLOAT_FIELDS, *BOOL_FIELDS)
# What an episode-statistics reader (rltrans.run.logging.EpisodeTracker) reads of a step's info.
EPISODE_INFO_KEYS = ("episode", "_episode", "success", "_success")


# ----------------------------------------------------------------------------- wire format


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf of nested mappings, named tuples, tuples and lists."""
    if isinstance(tree, Mapping):
        return {k: map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_leaves(fn, v) for v in tree))
    if isinstance(tree, tuple | list):
        return type(tree)(map_leaves(fn, v) for v in tree)
    return fn(tree)


def to_host(tree: Any) -> Any:
    """CPU NumPy arrays for the tensors of a tree (what pipes and Ray send without pickling
    tensors); tensors NumPy has no dtype for (bfloat16) stay tensors. Arrays may share memory
    with the tensors: a pipe or Ray copies what it sends at once."""

    def host(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        x = x.detach().cpu()
        try:
            return x.numpy()
        except TypeError:
            return x

    return map_leaves(host, tree)


def rollout_tensors(buffer: RolloutBuffer, bootstrap_value: Tensor) -> dict[str, Tree]:
    """A filled rollout as the tensors an actor sends, by :data:`ROLLOUT_KEYS`: the
    observation tree (T, N, ...), actions (T, N, ...), the T/L segment memories, the
    bootstrap value (N,), and the (T, N) float and bool fields."""
    out: dict[str, Tree] = {
        "obs": buffer.obs,
        "actions": buffer.actions,
        "memories": list(buffer.memories),
        "bootstrap_value": bootstrap_value,
    }
    out.update({name: getattr(buffer, name) for name in FLOAT_FIELDS + BOOL_FIELDS})
    return out


def buffer_from_views(
    views: Mapping[str, Any], num_steps: int, segment_length: int
) -> RolloutBuffer:
    """A RolloutBuffer whose storage is the tensors of :func:`rollout_tensors` (a slot's
    views, or a received copy); advantages and returns stay private."""
    num_envs = views["bootstrap_value"].shape[0]
    buffer = RolloutBuffer(num_steps, num_envs, segment_length, "cpu")
    buffer.obs, buffer.actions = views["obs"], views["actions"]
    for name in FLOAT_FIELDS + BOOL_FIELDS:
        setattr(buffer, name, views[name])
    buffer.memories = list(views["memories"])
    return buffer


def episode_info(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """The episode statistics of a step's info (None when no episode ended at that step):
    ``episode``/``_episode``, success flags and their ``final_info`` entries, on the host."""
    if "episode" not in info:
        return None
    out = {k: info[k] for k in EPISODE_INFO_KEYS if k in info}
    final = info.get("final_info")
    if isinstance(final, Mapping):
        out["final_info"] = {k: final[k] for k in ("success", "_success") if k in final}
        if "_final_info" in info:
            out["_final_info"] = info["_final_info"]
    return to_host(out)


# ----------------------------------------------------------------------------- actor side


def ignore_interrupts() -> None:
    """Ignore SIGINT in this actor process (from its main thread; elsewhere a no-op): the
    learner handles Ctrl-C, then closes its actors as at a normal finish."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class ActorSpec:
    """What every actor of a pool is built from (sent whole to each actor process)."""

    agent_cfg: dict  # plain agent config (registry.build_agent)
    env_cfg: dict  # plain env config (envs.make_env); num_envs = N per rollout
    num_steps: int  # T steps per rollout
    segment_length: int  # L steps per training segment (T is a multiple of L)
    torch_threads: int = 1  # torch threads of the actor process


class RemoteActor:
    """An actor in a process of its own: its env and agent, built from ``spec`` on the CPU,
    and (after :meth:`start`) a :class:`LocalActor` over them.

    Two steps, so that a transport may load the learner's weights in between: :meth:`start`
    seeds the RNGs with ``seed`` and resets the envs, as a LocalActor of the learner's process
    built after ``seed_everything(seed)`` does.
    """

    def __init__(self, spec: ActorSpec, seed: int) -> None:
        from rltrans.envs import make_env
        from rltrans.registry import build_agent
        from rltrans.run.context import set_threads

        set_threads(spec.torch_threads)
        self.spec, self.seed = spec, seed
        self.envs = make_env(spec.env_cfg, seed=seed, device="cpu")
        space, action_space = self.envs.single_observation_space, self.envs.single_action_space
        self.agent = build_agent(spec.agent_cfg, space, action_space)
        self.actor: LocalActor | None = None

    def start(self) -> None:
        """Seed the RNGs and reset the envs: the first episodes start."""
        from rltrans.run.context import seed_everything
        from rltrans.runtime.actors import LocalActor

        seed_everything(self.seed)
        self.actor = LocalActor(self.envs, self.agent, seed=self.seed, device="cpu")

    def collect(
        self, buffer: RolloutBuffer, version: int
    ) -> tuple[Tensor, list[dict[str, Any]], dict[str, float]]:
        """Fill ``buffer`` with one rollout acted by the agent's weights (``version``);
        returns its bootstrap value (N,), the :func:`episode_info` of each step where an
        episode ended, and the seconds spent stepping envs and acting."""
        assert self.actor is not None, "start() the actor first"
        infos: list[dict[str, Any]] = []

        def record_episodes(info: dict) -> None:
            kept = episode_info(info)
            if kept is not None:
                infos.append(kept)

        self.actor.set_policy_version(version)
        self.actor.collect(buffer, on_info=record_episodes)
        return self.actor.bootstrap_value(), infos, self.actor.pop_timings()

    def restart(self, seed: int) -> None:
        """Fresh episodes and memory from the next rollout on (``LocalActor.restart``)."""
        assert self.actor is not None, "start() the actor first"
        self.actor.restart(seed=seed)


# ----------------------------------------------------------------------------- pool side


class PoolStats:
    """What a remote pool counts for ``stats()``: counts since the start (``counts``), the
    lags of delivered rollouts and timings (``*_s``) since the last report."""

    def __init__(self, *counts: str) -> None:
        self.counts = dict.fromkeys(("actor_restarts", "dropped", "rollouts", *counts), 0)
        self.lags: dict[int, int] = {}
        self.times = dict.fromkeys(("queue_wait_s", "actor_wait_s", "env_s", "act_s"), 0.0)

    def acted(self, timings: Mapping[str, float], wait_s: float) -> None:
        """Add one rollout's actor timings: ``env``/``act`` seconds, ``wait_s`` idle."""
        self.times["actor_wait_s"] += wait_s
        self.times["env_s"] += timings["env"]
        self.times["act_s"] += timings["act"]

    def delivered(self, lag: int) -> None:
        """Count one rollout handed to the learner, ``lag`` versions behind."""
        self.lags[lag] = self.lags.get(lag, 0) + 1
        self.counts["rollouts"] += 1

    def report(self) -> dict[str, float]:
        """Counts since the start (``restarts`` = ``actor_restarts``); since the last report:
        ``*_ms`` timings and ``policy_lag_mean``/``_max``/``_hist/<lag>`` (delivered
        rollouts by lag)."""
        out: dict[str, float] = {k: float(v) for k, v in self.counts.items()}
        out["restarts"] = out["actor_restarts"]
        hist, self.lags = self.lags, {}
        total = sum(hist.values())
        out["policy_lag_mean"] = sum(k * v for k, v in hist.items()) / total if total else 0.0
        out["policy_lag_max"] = float(max(hist, default=0))
        out.update({f"policy_lag_hist/{k}": float(v) for k, v in sorted(hist.items())})
        times, self.times = self.times, dict.fromkeys(self.times, 0.0)
        out.update({k[: -len("_s")] + "_ms": 1e3 * v for k, v in times.items()})
        return out


@dataclass(kw_only=True)
class ActorSlot:
    """One actor of a remote pool as the pool tracks it; a transport adds its handles."""

    seed: int  # base seed: restarts derive theirs from it (restart_envs moves it)
    incarnation: int = 0  # restarts of this actor so far
    pid: int | None = None  # its process id, once known


class RemotePool:
    """The skeleton of an ``ActorPool`` (:mod:`rltrans.runtime.pool`) whose actors run
    elsewhere. The learner must :meth:`~rltrans.runtime.pool.ActorPool.publish` its weights
    (version 0) before the first :meth:`get`.

    Args:
        agent_cfg, env_cfg: what each actor builds (plain dicts or configs; env ``num_envs``
            = N, the envs of one rollout).
        num_actors: actors (>= 1); actor i resets its envs and seeds its RNGs with
            ``actor_seed(seed, i, N)``, as LocalPool's actors.
        num_steps, segment_length: T steps per rollout, a multiple of L.
        torch_threads: torch threads of each actor.
        max_restarts: restarts per actor; one more death closes the pool with RuntimeError.
        device: where rollouts are handed to the learner.
        on_info: sees, in this process before :meth:`get` returns a rollout (dropped ones
            included), the episode statistics of each step of it where an episode ended
            (:func:`episode_info`: the keys EpisodeTracker reads).

    A transport supplies ``publish`` and ``release`` and the hooks :meth:`_launch`,
    :meth:`_poll`, :meth:`_take`, :meth:`_send_restart`, :meth:`_stop` and :meth:`_options`.

    Example (``RayPool`` takes the same arguments):
        >>> with ProcessPool(agent_cfg, env_cfg, num_actors=2, num_steps=64,
        ...                  segment_length=16, seed=0) as pool:      # doctest: +SKIP
        ...     pool.publish(agent.state_dict(), 0)
        ...     rollout = pool.get()
        ...     learner.update([rollout.buffer], [rollout.bootstrap_value])
        ...     pool.release(rollout)  # its storage goes back to the actors
    """

    counts: tuple[str, ...] = ()  # the transport's own counts in stats()
    poll_s = 0.5  # longest single wait in get() (between checks of its timeout)
    max_policy_lag: int | None = None  # get() drops rollouts further behind; None: keep all
    num_envs: int  # envs per rollout (N), set by the transport before its actors start

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
    ) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        if segment_length < 1 or num_steps % segment_length:
            raise ValueError(f"num_steps={num_steps} must be a multiple of segment_length")
        self.agent_cfg, self.env_cfg = plain(agent_cfg), plain(env_cfg)
        self.num_actors, self.num_steps, self.segment_length = num_actors, num_steps, segment_length
        self.seed, self.max_restarts, self.torch_threads = seed, max_restarts, torch_threads
        self.device, self.on_info = torch.device(device), on_info
        self._spec = ActorSpec(
            self.agent_cfg, self.env_cfg, num_steps, segment_length, torch_threads
        )
        self._closed = True  # until the actors start
        self._published = -1  # the version of the newest weights
        self._stats = PoolStats(*self.counts)
        self._actors: list[Any] = [None] * num_actors  # ActorSlot; None while replaced

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        agent: torch.nn.Module | None = None,
        *,
        seed: int,
        device: torch.device | str = "cpu",
        on_info: Callable[[dict[str, Any]], Any] | None = None,
    ) -> Self:
        """The pool a training config describes (``runtime``, ``algo``, ``env``, ``agent``,
        ``torch_threads``). Dropping stale rollouts is left to the trainer (it scales the
        rewards of every rollout, dropped or not); ``agent`` is not needed (the trainer
        publishes its weights)."""
        env_cfg, shared, runtime = pool_arguments(cfg)
        options = cls._options(runtime)
        return cls(
            cfg.agent, env_cfg, **shared, seed=seed, device=device, on_info=on_info, **options
        )

    # -- the transport's part

    @classmethod
    def _options(cls, runtime: Mapping[str, Any]) -> dict[str, Any]:
        """The transport's own keyword arguments from a config's ``runtime`` section."""
        raise NotImplementedError

    def _launch(self, i: int, seed: int, incarnation: int = 0) -> ActorSlot:
        """Start actor ``i`` (its ``incarnation``-th restart) with ``seed``; its slot."""
        raise NotImplementedError

    def _poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for what actors send (rollouts, deaths) and handle it."""
        raise NotImplementedError

    def _take(self) -> Rollout | None:
        """The next rollout already received (via :meth:`_deliver`), or None."""
        raise NotImplementedError

    def _send_restart(self, actor: ActorSlot) -> None:
        """Tell an actor to restart its episodes with ``actor.seed`` (after its queued work)."""
        raise NotImplementedError

    def _stop(self, actors: list[Any]) -> None:
        """Stop the live actors and free the transport (called once, by :meth:`close`)."""
        raise NotImplementedError

    # -- start, deliver, restart

    def _start_all(self) -> None:
        """Open the pool (closed at exit at the latest) and start every actor."""
        self._closed = False
        atexit.register(self.close)
        with self._closing_on_error():
            for i in range(self.num_actors):
                self._actors[i] = self._launch(i, actor_seed(self.seed, i, self.num_envs))

    @contextlib.contextmanager
    def _closing_on_error(self) -> Iterator[None]:
        """Close the pool (stop every actor) when the block raises, then re-raise."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _fail(self, message: str) -> NoReturn:
        """Close the pool and raise RuntimeError(``message``)."""
        self.close()
        raise RuntimeError(message)

    def _deliver(
        self, i: int, views: Mapping[str, Any], version: int, infos: list, slot: int | None = None
    ) -> Rollout | None:
        """The rollout of actor ``i`` from its :data:`ROLLOUT_KEYS` tensors (on ``device``),
        acted by weights ``version``; None when it is dropped (more than ``max_policy_lag``
        versions behind). Its episode statistics go to ``on_info`` either way."""
        if self.on_info is not None:  # every rollout's episodes count, kept or not
            for info in infos:
                self.on_info(info)
        lag = self._published - version
        if self.max_policy_lag is not None and lag > self.max_policy_lag:
            self._stats.counts["dropped"] += 1
            return None
        self._stats.delivered(lag)
        if self.device.type != "cpu":
            views = tree_map(lambda t: t.to(self.device, non_blocking=True), views)
        buffer = buffer_from_views(views, self.num_steps, self.segment_length)
        buffer.device = self.device
        buffer.policy_version = version
        return Rollout(buffer, views["bootstrap_value"], version, i, slot)

    def _restart(self, i: int, dead: ActorSlot, why: str) -> None:
        """Start the next incarnation of actor ``i`` (``dead``, which died ``why``) with a new
        seed, saying so on stderr; once it has died ``max_restarts`` + 1 times, close the pool
        and raise RuntimeError."""
        if dead.incarnation >= self.max_restarts:
            self._fail(
                f"actor {i} died {dead.incarnation + 1} times, the last {why} "
                f"(max_restarts={self.max_restarts})"
            )
        self._stats.counts["actor_restarts"] += 1
        seed = dead.seed + 1_000_003 * (dead.incarnation + 1)
        print(
            f"rltrans: actor {i} (pid {dead.pid or '?'}) died {why}; restarting it with seed "
            f"{seed}",
            file=sys.stderr,
        )
        self._actors[i] = self._launch(i, seed, dead.incarnation + 1)
        self._actors[i].seed = dead.seed  # later restarts derive from the base seed

    # -- the learner side

    def get(self, timeout: float | None = None) -> Rollout:
        """The next filled rollout (blocks; ``timeout`` seconds raise TimeoutError)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._published < 0:
            raise RuntimeError("publish() the weights before get(): the actors act with them")
        start = time.perf_counter()
        try:
            while True:
                rollout = self._take()
                if rollout is not None:
                    self._stats.times["queue_wait_s"] += time.perf_counter() - start
                    return rollout
                wait = self.poll_s
                if timeout is not None:
                    wait = min(wait, start + timeout - time.perf_counter())
                    if wait <= 0:
                        raise TimeoutError(f"no rollout within {timeout} s")
                self._poll(wait)
        except KeyboardInterrupt:
            self.close()
            raise

    def restart_envs(self, seed: int) -> None:
        """Every actor restarts its episodes with ``actor_seed(seed, actor_id, num_envs)``
        before its next rollout not yet under way or queued (those are still delivered)."""
        for i, actor in enumerate(self._actors):
            if actor is not None:
                actor.seed = actor_seed(seed, i, self.num_envs)
                self._send_restart(actor)

    def stats(self) -> dict[str, float]:
        """Counts since the start: ``restarts`` (= ``actor_restarts``), ``dropped``,
        ``rollouts`` (delivered) and the transport's own (:attr:`counts`). Since the last
        call: ``queue_wait_ms`` (the learner waiting in get), ``actor_wait_ms`` (actors
        waiting for work, summed), ``env_ms`` and ``act_ms`` (summed over actors),
        ``policy_lag_mean``/``_max`` and ``policy_lag_hist/<lag>`` (delivered rollouts by
        lag)."""
        return self._stats.report()

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the actors (None while one is unknown or being replaced)."""
        return [None if a is None else a.pid for a in self._actors]

    def close(self, cut_short: bool = False) -> None:
        """Stop every actor and free the transport. Idempotent. ``cut_short`` changes
        nothing: actors that do not stop when asked are terminated, never awaited."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stop([a for a in self._actors if a is not None])
        self._actors = [None] * self.num_actors

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()
