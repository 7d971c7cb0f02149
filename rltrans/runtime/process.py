"""Actor processes for asynchronous learners (IMPALA's ``runtime=process``).

:class:`ProcessPool` runs ``num_actors`` processes; each builds its env (``make_env``) and
agent (``build_agent``) from the plain configs and acts with
:class:`~rltrans.runtime.actors.LocalActor` (so the one acting loop is reused), writing every
rollout straight into a slot of one pre-allocated shared-memory block. The learner takes
filled rollouts with :meth:`ProcessPool.get` (views into the slot: no copy) and hands the
slot back with :meth:`ProcessPool.release`.

Design:

* Start method ``spawn`` (default) or ``forkserver``; never ``fork`` (the parent has torch
  threads). A spawned actor pays the imports of torch and rltrans (4.3 s to ready on a
  2-core machine; two at once 7.5 s); with ``forkserver`` the server imports them once
  (the first pool as slow), later actors (and restarts) start in ~0.1 s, but the server
  process lives on until the parent exits.
* Shared memory: one uint8 block holds ``slots`` slots, each every tensor of a rollout
  (observations, actions, log-probs, values, rewards, flags, the T/L segment memories and the
  bootstrap value) at 64-byte aligned offsets; the layout comes from a template (one env reset
  and one ``act`` in the parent, RNG state restored). Weights are one flat shared tensor per
  dtype of the agent's ``state_dict`` plus a shared version and a sequence counter.
* Channels: each actor has its own pair of pipes (slot grants and commands in, rollout
  notices out), and the parent waits on those pipes and the processes' sentinels together.
  No lock or queue is shared between actors, so an actor killed at any moment cannot leave a
  lock held that would stall the others (a killed reader of a shared ``mp.Queue`` keeps
  its lock forever). The parent owns the slot accounting: a slot is free, granted to one
  actor (at most 2 at a time), ready, or held by the learner.
* Weights: :meth:`ProcessPool.publish` writes under a sequence lock (odd while writing, no
  lock an actor could take with it when killed); before each rollout an actor copies the
  weights only when the version moved, re-reading if a publish overlapped its copy.
  ``LocalActor.collect`` then calls ``agent.refresh_state``.
* Seeds: actor i resets its envs and seeds its torch RNG with ``actor_seed(seed, i, N)`` of
  :mod:`rltrans.runtime.pool` (as LocalPool's actors); one actor with the learner's weights
  repeats a LocalActor of this process exactly.
* Failures: a dead actor (exception, SIGKILL) wakes the parent through its sentinel; its
  rollouts already sent are kept, the slots it held are reclaimed, a one-line warning names
  it and its exit code, and it restarts with a new seed (``max_restarts`` per actor; an
  actor that fails before its first rollout with an exception fails the pool at once).
  Actors ignore SIGINT (the parent stops them), and exit when the parent's pipe closes or
  their parent process changes.

Rewards are stored as the env returned them: reward scaling, if any, is the learner's (it
keeps the running statistics, so they are in its checkpoints). Episode statistics travel with
each rollout notice (the info keys EpisodeTracker reads) to the pool's ``on_info``.

Example:
    >>> with ProcessPool(agent_cfg, env_cfg, num_actors=2, num_steps=64, segment_length=16,
    ...                  seed=0) as pool:                             # doctest: +SKIP
    ...     pool.publish(agent.state_dict(), 0)
    ...     rollout = pool.get()       # views of a shared slot
    ...     learner.update([rollout.buffer], [rollout.bootstrap_value])
    ...     pool.release(rollout)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_any
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import Tensor

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.runtime.pool import (
    PoolStats,
    Rollout,
    actor_seed,
    plain,
    pool_arguments,
    restart_seed,
)
from rltrans.types import Tree, tree_map

ALIGN = 64  # bytes between tensor starts in a slot
GRANTS_PER_ACTOR = 2  # slots an actor may hold at once: one being written, one next
FORKSERVER_PRELOAD = ("torch", "rltrans.registry", "rltrans.envs", "rltrans.runtime.actors")
FLOAT_FIELDS = ("log_probs", "values", "rewards", "final_values")
BOOL_FIELDS = ("terminated", "truncated", "starts")


# ----------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Field:
    """One tensor of a slot: where it starts in the slot and what it holds."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _map_fields(fn: Callable[[Field], Any], tree: Any) -> Any:
    """tree_map over :class:`Field` leaves (other leaves pass through)."""
    if isinstance(tree, Field):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_fields(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_map_fields(fn, v) for v in tree))
    if isinstance(tree, tuple | list):
        return type(tree)(_map_fields(fn, v) for v in tree)
    return tree


def slot_layout(template: Tree) -> tuple[Tree, int]:
    """The :class:`Field` tree of a slot holding tensors shaped as ``template``'s, and the
    slot's size in bytes (a multiple of :data:`ALIGN`)."""
    end = 0

    def place(t: Tensor) -> Field:
        nonlocal end
        field = Field(end, t.dtype, tuple(t.shape))
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        return field

    return tree_map(place, template), max(end, ALIGN)


def slot_views(block: Tensor, layout: Tree, slot: int, slot_bytes: int) -> Tree:
    """Tensors viewing slot ``slot`` of the shared uint8 ``block``."""
    base = slot * slot_bytes

    def view(f: Field) -> Tensor:
        count = 1
        for d in f.shape:
            count *= d
        nbytes = count * torch.empty((), dtype=f.dtype).element_size()
        start = base + f.offset
        return block[start : start + nbytes].view(f.dtype).view(f.shape)

    return _map_fields(view, layout)


def buffer_from_views(views: Mapping[str, Any], num_steps: int, segment_length: int):
    """A RolloutBuffer whose storage is a slot's views (advantages/returns stay private)."""
    num_envs = views["bootstrap_value"].shape[0]
    buffer = RolloutBuffer(num_steps, num_envs, segment_length, "cpu")
    buffer.obs, buffer.actions = views["obs"], views["actions"]
    for name in FLOAT_FIELDS + BOOL_FIELDS:
        setattr(buffer, name, views[name])
    buffer.memories = list(views["memories"])
    return buffer


class SharedWeights:
    """A state_dict in shared memory: one flat tensor per dtype, a version, a sequence lock.

    Built in the parent from a template state_dict and sent whole to the actors.
    """

    def __init__(self, state_dict: Mapping[str, Tensor], ctx) -> None:
        self.specs: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        sizes: dict[torch.dtype, int] = {}
        for key, t in state_dict.items():
            if isinstance(t, Tensor):
                self.specs.append((key, t.dtype, tuple(t.shape), sizes.get(t.dtype, 0)))
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        self.flats = {str(d): torch.zeros(n, dtype=d).share_memory_() for d, n in sizes.items()}
        self.seq = ctx.Value("q", 0, lock=False)  # odd while the parent writes
        self.version = ctx.Value("q", -1, lock=False)  # -1 until the first publish

    def views(self) -> dict[str, Tensor]:
        """The state_dict as views of the flat tensors."""
        out = {}
        for key, dtype, shape, offset in self.specs:
            count = 1
            for d in shape:
                count *= d
            out[key] = self.flats[str(dtype)][offset : offset + count].view(shape)
        return out

    def write(self, state_dict: Mapping[str, Tensor], version: int, views: dict) -> None:
        """Copy ``state_dict`` in (single writer: the parent)."""
        missing = [k for k in views if k not in state_dict]
        if missing:
            raise KeyError(f"publish: state_dict lacks {missing[:5]} (the pool's agent has them)")
        self.seq.value += 1
        try:
            with torch.no_grad():
                for key, dst in views.items():
                    dst.copy_(state_dict[key].detach().reshape(dst.shape))
            self.version.value = int(version)
        finally:
            self.seq.value += 1

    def read_into(self, agent: torch.nn.Module, views: dict, have: int, parent_pid: int) -> int:
        """Load the newest weights into ``agent`` unless its version ``have`` is the newest;
        returns the version loaded. -1 when nothing was published yet."""
        while True:
            s1 = self.seq.value
            if s1 % 2:  # a publish is under way
                time.sleep(0.0002)
                if not _parent_alive(parent_pid):  # died while publishing
                    raise SystemExit(0)
                continue
            version = self.version.value
            if version == have or version < 0:
                return version
            agent.load_state_dict(views, strict=False)
            if self.seq.value == s1:
                return version


# ----------------------------------------------------------------------------- actor process


def _parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


# What an episode-statistics reader (rltrans.logging.EpisodeTracker) reads of a step's info.
EPISODE_INFO_KEYS = ("episode", "_episode", "success", "_success")


def _to_host(x: Any) -> Any:
    """NumPy copies of tensors in nested dicts (sent through a pipe, not shared memory)."""
    if isinstance(x, Mapping):
        return {k: _to_host(v) for k, v in x.items()}
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    return x


def episode_info(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """The episode statistics of a step's info (None when no episode ended at that step):
    ``episode``/``_episode``, success flags and their ``final_info`` entries."""
    if "episode" not in info:
        return None
    out = {k: info[k] for k in EPISODE_INFO_KEYS if k in info}
    final = info.get("final_info")
    if isinstance(final, Mapping):
        out["final_info"] = {k: final[k] for k in ("success", "_success") if k in final}
        if "_final_info" in info:
            out["_final_info"] = info["_final_info"]
    return _to_host(out)


def actor_main(
    actor_id: int,
    seed: int,
    agent_cfg: dict,
    env_cfg: dict,
    num_steps: int,
    segment_length: int,
    block: Tensor,
    layout: Tree,
    slot_bytes: int,
    weights: SharedWeights,
    commands: Connection,
    notices: Connection,
    parent_pid: int,
    torch_threads: int,
) -> None:
    """An actor process: build env and agent, then fill granted slots until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from rltrans.envs import make_env
    from rltrans.registry import build_agent
    from rltrans.run import seed_everything, set_threads
    from rltrans.runtime.actors import LocalActor

    set_threads(torch_threads)
    envs = make_env(env_cfg, seed=seed, device="cpu")
    agent = build_agent(agent_cfg, envs.single_observation_space, envs.single_action_space)
    views = weights.views()
    grants: deque[int] = deque()
    restart_seed: list[int] = []

    def receive(timeout: float) -> bool:
        """Take one command if one comes within ``timeout`` s; False = stop."""
        if not commands.poll(timeout):
            return _parent_alive(parent_pid)
        try:
            kind, arg = commands.recv()
        except EOFError:  # the parent is gone
            return False
        if kind == "slot":
            grants.append(arg)
        elif kind == "restart":
            restart_seed.append(arg)
        return kind != "stop"

    version = weights.read_into(agent, views, -1, parent_pid)
    while version < 0:  # the learner publishes its weights first
        if not receive(0.05):
            return
        version = weights.read_into(agent, views, version, parent_pid)
    seed_everything(seed)
    actor = LocalActor(envs, agent, seed=seed, device="cpu")
    buffers: dict[int, tuple[RolloutBuffer, Any]] = {}
    infos: list[dict] = []

    def record_episodes(info: dict) -> None:
        kept = episode_info(info)
        if kept is not None:
            infos.append(kept)

    try:
        notices.send(("ready", actor_id))
    except (BrokenPipeError, OSError):  # the parent is gone
        return
    wait_s = 0.0
    while True:
        while not grants or commands.poll():  # take every command before the next rollout
            t0 = time.perf_counter()
            going = receive(0.2)
            wait_s += time.perf_counter() - t0
            if not going:
                return
        if restart_seed:
            actor.restart(seed=restart_seed[-1])
            restart_seed.clear()
        slot = grants.popleft()
        if slot not in buffers:
            slot_tensors = slot_views(block, layout, slot, slot_bytes)
            buffers[slot] = (
                buffer_from_views(slot_tensors, num_steps, segment_length),
                slot_tensors,
            )
        buffer, slot_tensors = buffers[slot]
        version = weights.read_into(agent, views, version, parent_pid)
        actor.set_policy_version(version)
        infos.clear()
        actor.collect(buffer, on_info=record_episodes)
        with torch.no_grad():
            for dst, src in zip(slot_tensors["memories"], buffer.memories, strict=True):
                tree_map(lambda d, s: d.copy_(s), dst, src)
            slot_tensors["bootstrap_value"].copy_(actor.bootstrap_value())
        buffer.memories = list(slot_tensors["memories"])
        timings = actor.pop_timings()
        try:
            notices.send(("rollout", (slot, version, timings, wait_s, list(infos))))
        except (BrokenPipeError, OSError):
            return
        wait_s = 0.0


# ----------------------------------------------------------------------------- the pool


def _send(conn: Connection, message: Any) -> None:
    """Send, ignoring a dead receiver (its process sentinel reports the death)."""
    with contextlib.suppress(BrokenPipeError, OSError):
        conn.send(message)


@dataclass
class _ActorHandle:
    process: Any
    commands: Connection  # parent end: slot grants and commands to the actor
    notices: Connection  # parent end: rollout notices from the actor
    seed: int
    granted: set[int]
    ready: bool = False
    incarnation: int = 0


class ProcessPool:
    """``num_actors`` actor processes feeding a learner through shared-memory slots.

    Implements the ``ActorPool`` protocol of :mod:`rltrans.runtime.pool`. The learner must
    :meth:`publish` its weights (version 0) before the first :meth:`get`; actors wait for
    them. A rollout's tensors are views of its slot (copies on ``device`` when that is not
    the CPU): use them, then :meth:`release` it and keep no reference. Actor i resets its
    envs and seeds its torch RNG with ``actor_seed(seed, i, num_envs)`` (as LocalPool's
    actors). ``on_info(info)`` sees, in this process before :meth:`get` returns a rollout
    (dropped ones included), the episode statistics of each step of it where an episode
    ended (:func:`episode_info`: the keys EpisodeTracker reads). ``max_policy_lag``: drop
    (and count) rollouts more than that many versions behind the last publish in
    :meth:`get`; None leaves dropping to the caller.
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
        slots: int | None = None,
        max_policy_lag: int | None = None,
        torch_threads: int = 1,
        start_method: str = "spawn",
        max_restarts: int = 10,
        device: torch.device | str = "cpu",
        on_info: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:

        if start_method == "fork":
            raise ValueError(
                "start_method='fork' is unsafe once torch threads exist (a forked child can "
                "deadlock on a lock a parent thread held); use spawn or forkserver"
            )
        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        slots = 2 * num_actors if slots is None else slots
        if slots < num_actors:
            raise ValueError(f"slots={slots} must be >= num_actors={num_actors}")
        self.agent_cfg, self.env_cfg = plain(agent_cfg), plain(env_cfg)
        self.num_actors, self.num_steps, self.segment_length = num_actors, num_steps, segment_length
        self.seed, self.max_policy_lag, self.max_restarts = seed, max_policy_lag, max_restarts
        self.torch_threads, self.device, self.on_info = torch_threads, torch.device(device), on_info
        self._closed = True  # until the actors exist
        self._ctx = tmp.get_context(start_method)
        if start_method == "forkserver":  # the server imports these once; actors fork from it
            self._ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))

        template, state_dict = self._template(seed)
        self.num_envs = int(template["bootstrap_value"].shape[0])
        self._layout, self._slot_bytes = slot_layout(template)
        self._block = torch.zeros(slots * self._slot_bytes, dtype=torch.uint8).share_memory_()
        self._views = [
            slot_views(self._block, self._layout, s, self._slot_bytes) for s in range(slots)
        ]
        self._weights = SharedWeights(state_dict, self._ctx)
        self._weight_views = self._weights.views()
        self._published = -1

        self._free: deque[int] = deque(range(slots))
        self._ready: deque[tuple[int, int, int, list]] = deque()  # actor, slot, version, infos
        self._held: set[int] = set()  # slots the learner holds
        self._stats = PoolStats()
        self._created = t0 = time.perf_counter()
        self._actors: list[_ActorHandle | None] = [None] * num_actors
        self._closed = False
        atexit.register(self.close)
        try:
            for i in range(num_actors):
                self._start_actor(i, self._actor_seed(seed, i))
        except BaseException:
            self.close()
            raise
        self.spawn_s = time.perf_counter() - t0  # to start the processes; they build after
        self._grant()

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        agent: torch.nn.Module | None = None,
        *,
        seed: int,
        device: torch.device | str = "cpu",
        on_info: Callable[[dict[str, Any]], Any] | None = None,
    ) -> ProcessPool:
        """The pool a training config describes (``runtime``, ``algo``, ``env``, ``agent``,
        ``torch_threads``). Dropping stale rollouts is left to the trainer (it scales the
        rewards of every rollout, dropped or not); ``agent`` is not needed (the trainer
        publishes its weights)."""
        env_cfg, shared, runtime = pool_arguments(cfg)
        return cls(
            cfg.agent,
            env_cfg,
            **shared,
            seed=seed,
            slots=runtime.get("slots"),
            max_policy_lag=None,
            start_method=str(runtime.get("start_method", "spawn")),
            device=device,
            on_info=on_info,
        )

    def _actor_seed(self, seed: int, i: int) -> int:
        return actor_seed(seed, i, self.num_envs)

    # -- set-up

    def _template(self, seed: int) -> tuple[dict[str, Tree], dict[str, Tensor]]:
        """One rollout's tensors (zeros) and the agent's state_dict, from one env reset and
        one act in this process; the global RNG state is restored afterwards."""
        from rltrans.envs import make_env
        from rltrans.registry import build_agent
        from rltrans.spaces import obs_to_tensor

        with torch.random.fork_rng(devices=[]):
            envs = make_env(self.env_cfg, seed=seed, device="cpu")
            try:
                space = envs.single_observation_space
                agent = build_agent(self.agent_cfg, space, envs.single_action_space)
                raw, _ = envs.reset(seed=seed)
                obs = obs_to_tensor(raw, space, "cpu")
                n = envs.num_envs
                state = agent.initial_state(n)
                memory = agent.state_to_memory(state)
                out, _ = agent.act(obs, state, torch.ones(n, dtype=torch.bool))
            finally:
                envs.close()
        t, k = self.num_steps, self.num_steps // self.segment_length
        if self.segment_length < 1 or self.num_steps % self.segment_length:
            raise ValueError(f"num_steps={t} must be a multiple of segment_length")
        steps = lambda x: torch.zeros((t, *x.shape), dtype=x.dtype)  # noqa: E731
        template: dict[str, Tree] = {
            "obs": tree_map(steps, obs),
            "actions": steps(out.action),
            "memories": [tree_map(torch.zeros_like, memory) for _ in range(k)],
            "bootstrap_value": torch.zeros(n),
        }
        template.update({f: torch.zeros(t, n) for f in FLOAT_FIELDS})
        template.update({f: torch.zeros(t, n, dtype=torch.bool) for f in BOOL_FIELDS})
        return template, agent.state_dict()

    def _start_actor(self, i: int, seed: int, incarnation: int = 0) -> None:
        cmd_recv, cmd_send = self._ctx.Pipe(duplex=False)
        note_recv, note_send = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=actor_main,
            name=f"rltrans-actor-{i}",
            args=(
                i, seed, self.agent_cfg, self.env_cfg, self.num_steps, self.segment_length,
                self._block, self._layout, self._slot_bytes, self._weights, cmd_recv,
                note_send, os.getpid(), self.torch_threads,
            ),
            daemon=True,
        )  # fmt: skip
        process.start()
        cmd_recv.close()
        note_send.close()
        self._actors[i] = _ActorHandle(
            process, cmd_send, note_recv, seed, set(), False, incarnation
        )

    def _grant(self) -> None:
        """Give free slots to the actors holding the fewest (at most GRANTS_PER_ACTOR each)."""
        while self._free:
            live = [i for i, a in enumerate(self._actors) if a is not None]
            if not live:
                return
            i = min(live, key=lambda j: len(self._actors[j].granted))
            actor = self._actors[i]
            if len(actor.granted) >= GRANTS_PER_ACTOR:
                return
            slot = self._free.popleft()
            actor.granted.add(slot)
            _send(actor.commands, ("slot", slot))

    # -- the learner side

    def publish(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Make ``state_dict`` the weights of every rollout started from now on."""
        self._weights.write(state_dict, version, self._weight_views)
        self._published = int(version)

    def get(self, timeout: float | None = None) -> Any:
        """The next filled rollout (blocks; ``timeout`` seconds raise TimeoutError). Rollouts
        more than ``max_policy_lag`` versions behind the last publish are dropped."""
        if self._closed:
            raise RuntimeError("ProcessPool is closed")
        start = time.perf_counter()
        try:
            while True:
                while self._ready:
                    i, slot, version, infos = self._ready.popleft()
                    if self.on_info is not None:  # every rollout's episodes count, kept or not
                        for info in infos:
                            self.on_info(info)
                    lag = self._published - version
                    if self.max_policy_lag is not None and lag > self.max_policy_lag:
                        self._stats.counts["dropped"] += 1
                        self._free.append(slot)
                        self._grant()
                        continue
                    self._stats.delivered(lag)
                    self._held.add(slot)
                    self._stats.times["queue_wait_s"] += time.perf_counter() - start
                    return self._rollout(i, slot, version)
                if len(self._held) == len(self._views):
                    raise RuntimeError("every slot is held by the learner: release() rollouts")
                wait = 0.5
                if timeout is not None:
                    wait = min(wait, start + timeout - time.perf_counter())
                    if wait <= 0:
                        raise TimeoutError(f"no rollout within {timeout} s")
                self._poll(wait)
        except KeyboardInterrupt:
            self.close()
            raise

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until every actor has built its env and agent and loaded the published
        weights (publish first); returns the seconds since the pool was constructed."""
        start = time.perf_counter()
        while not all(a is not None and a.ready for a in self._actors):
            if timeout is not None and time.perf_counter() - start > timeout:
                raise TimeoutError(f"actors not ready within {timeout} s")
            self._poll(0.05)
        return time.perf_counter() - self._created

    def _rollout(self, i: int, slot: int, version: int) -> Any:
        views = self._views[slot]
        if self.device.type != "cpu":
            views = tree_map(lambda t: t.to(self.device, non_blocking=True), views)
        buffer = buffer_from_views(views, self.num_steps, self.segment_length)
        buffer.device = self.device
        buffer.policy_version = version
        return Rollout(buffer, views["bootstrap_value"], version, i, slot)

    def release(self, rollout: Any) -> None:
        """Hand a rollout's slot back to the actors."""
        slot = rollout.slot
        if slot not in self._held:
            raise ValueError(f"slot {slot} is not held by the learner (released twice?)")
        self._held.discard(slot)
        self._free.append(slot)
        if not self._closed:
            self._grant()

    def _poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for rollout notices or actor deaths, and handle them."""
        live = [a for a in self._actors if a is not None]
        waitables = [a.notices for a in live] + [a.process.sentinel for a in live]
        ready = set(wait_any(waitables, timeout))
        for i, actor in enumerate(self._actors):
            if actor is None:
                continue
            if actor.notices in ready:
                self._drain(i)
            if actor.process.sentinel in ready:
                self._restart_dead(i)

    def _drain(self, i: int) -> None:
        actor = self._actors[i]
        try:
            while actor.notices.poll():
                kind, payload = actor.notices.recv()
                if kind == "ready":
                    actor.ready = True
                elif kind == "rollout":
                    slot, version, timings, wait_s, infos = payload
                    actor.granted.discard(slot)
                    self._ready.append((i, slot, version, infos))
                    self._stats.times["actor_wait_s"] += wait_s
                    self._stats.times["env_s"] += timings["env"]
                    self._stats.times["act_s"] += timings["act"]
        except (EOFError, OSError):  # died mid-way: the sentinel reports it
            pass

    def _restart_dead(self, i: int) -> None:
        actor = self._actors[i]
        actor.process.join(timeout=1.0)
        code = actor.process.exitcode
        self._drain(i)  # rollouts it finished before dying are good
        self._free.extend(sorted(actor.granted))
        for conn in (actor.commands, actor.notices):
            conn.close()
        self._actors[i] = None
        if not actor.ready and actor.incarnation == 0 and code is not None and code > 0:
            self.close()
            raise RuntimeError(
                f"actor {i} failed while starting (exit code {code}); its traceback is above"
            )
        try:
            seed = restart_seed(
                self._stats,
                i,
                base_seed=actor.seed,
                incarnation=actor.incarnation,
                max_restarts=self.max_restarts,
                pid=actor.process.pid,
                why=f"with exit code {code}",
            )
        except RuntimeError:
            self.close()
            raise
        self._start_actor(i, seed, actor.incarnation + 1)
        self._actors[i].seed = actor.seed  # later restarts derive from the base seed
        self._grant()

    # -- control and statistics

    def restart_envs(self, seed: int) -> None:
        """Every actor restarts its episodes with ``actor_seed(seed, actor_id, num_envs)``
        before its next rollout (rollouts already made or under way are still delivered)."""
        for i, actor in enumerate(self._actors):
            if actor is None:
                continue
            actor.seed = self._actor_seed(seed, i)
            _send(actor.commands, ("restart", actor.seed))

    def stats(self) -> dict[str, float]:
        """Counts since the start: ``restarts`` (= ``actor_restarts``), ``dropped``, ``rollouts``
        (delivered). Since the last call: ``queue_wait_ms`` (the learner waiting in get),
        ``actor_wait_ms`` (actors waiting for a slot, summed), ``env_ms`` and ``act_ms``
        (summed over actors), ``policy_lag_mean``/``_max`` and ``policy_lag_hist/<lag>``
        (delivered rollouts by lag)."""
        return self._stats.report()

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the actors (None while one is being replaced)."""
        return [None if a is None else a.process.pid for a in self._actors]

    def close(self) -> None:
        """Stop every actor (politely, then SIGTERM, then SIGKILL) and wait for them."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        actors = [a for a in self._actors if a is not None]
        for actor in actors:
            _send(actor.commands, ("stop", None))
        deadline = time.monotonic() + 3.0
        for actor in actors:
            actor.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for stop in ("terminate", "kill"):
            alive = [a for a in actors if a.process.is_alive()]
            for actor in alive:
                getattr(actor.process, stop)()
            for actor in alive:
                actor.process.join(timeout=2.0)
        for actor in actors:
            for conn in (actor.commands, actor.notices):
                conn.close()
        self._actors = [None] * self.num_actors

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
