"""Actor processes for asynchronous learners (IMPALA's ``runtime=process``).

:class:`ProcessPool` runs ``num_actors`` processes, each a
:class:`~rltrans.runtime.remote.RemoteActor` writing every rollout straight into a slot of one
shared-memory block; :meth:`ProcessPool.get` returns views into the slot (no copy) and
:meth:`ProcessPool.release` hands it back. What it shares with the Ray pool is
:class:`~rltrans.runtime.remote.RemotePool`; this module holds processes, pipes and memory.

* Start method ``spawn`` (default) or ``forkserver``, never ``fork`` (the parent has torch
  threads); ``forkserver`` pays torch's imports once, so restarts start in ~0.1 s, and its
  server lives until the parent exits.
* The block holds ``slots`` slots of every rollout tensor (``rollout_tensors`` of
  :mod:`rltrans.runtime.remote`) at 64-byte aligned offsets, laid out from a template (one
  reset and one ``act`` in the parent, RNG state restored). Weights are one shared tensor
  per dtype plus a version and a sequence counter.
* Each actor has its own pipes; no lock or queue is shared between actors, so one killed at
  any moment cannot stall the others. The parent owns the slot accounting (free, granted,
  ready, held by the learner; at most 2 granted per actor).
* :meth:`ProcessPool.publish` writes under a sequence lock an actor cannot take with it when
  killed; an actor copies the weights only when the version moved. Actor i seeds with
  ``actor_seed(seed, i, N)``, so one actor repeats a LocalActor exactly.
* A dead actor wakes the parent through its sentinel: its sent rollouts are kept, its slots
  reclaimed, a warning names its exit code, and it restarts with a new seed (up to
  ``max_restarts``; one that fails before its first rollout fails the pool). Actors start
  with SIGINT ignored (the parent stops them) and exit when its pipe closes.

Rewards are stored as the env returned them (scaling, and its statistics, are the learner's);
episode statistics travel with each rollout notice to the pool's ``on_info``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_any
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import Tensor

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.runtime.pool import Rollout
from rltrans.runtime.remote import (
    ActorSlot,
    ActorSpec,
    RemoteActor,
    RemotePool,
    buffer_from_views,
    ignore_interrupts,
    rollout_tensors,
)
from rltrans.runtime.shared import SharedWeights, parent_alive, slot_layout, slot_views
from rltrans.types import Tree, tree_map


@contextlib.contextmanager
def _born_ignoring_sigint() -> Any:
    """Start processes with SIGINT ignored: an ignored signal stays ignored across exec, and
    a new interpreter then installs no KeyboardInterrupt handler. The parent ignores SIGINT
    only for the moment of the start (main thread only: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


GRANTS_PER_ACTOR = 2  # slots an actor may hold at once: one being written, one next
FORKSERVER_PRELOAD = ("torch", "rltrans.registry", "rltrans.envs", "rltrans.runtime.actors")


# ----------------------------------------------------------------------------- actor process


def actor_main(
    actor_id: int,
    seed: int,
    spec: ActorSpec,
    block: Tensor,
    layout: Tree,
    slot_bytes: int,
    weights: SharedWeights,
    commands: Connection,
    notices: Connection,
    parent_pid: int,
) -> None:
    """An actor process: build env and agent, then fill granted slots until told to stop."""
    ignore_interrupts()  # Ctrl-C is the learner's to handle; it stops this process
    worker = RemoteActor(spec, seed)
    views = weights.views()
    grants: deque[int] = deque()
    restart_seed: list[int] = []

    def receive(timeout: float) -> bool:
        """Take one command if one comes within ``timeout`` s; False = stop."""
        if not commands.poll(timeout):
            return parent_alive(parent_pid)
        try:
            kind, arg = commands.recv()
        except EOFError:  # the parent is gone
            return False
        if kind == "slot":
            grants.append(arg)
        elif kind == "restart":
            restart_seed.append(arg)
        return kind != "stop"

    version = weights.read_into(worker.agent, views, -1, parent_pid)
    while version < 0:  # the learner publishes its weights first
        if not receive(0.05):
            return
        version = weights.read_into(worker.agent, views, version, parent_pid)
    worker.start()
    buffers: dict[int, tuple[RolloutBuffer, Any]] = {}
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
            worker.restart(restart_seed[-1])
            restart_seed.clear()
        slot = grants.popleft()
        if slot not in buffers:
            slot_tensors = slot_views(block, layout, slot, slot_bytes)
            buffers[slot] = (
                buffer_from_views(slot_tensors, spec.num_steps, spec.segment_length),
                slot_tensors,
            )
        buffer, slot_tensors = buffers[slot]
        version = weights.read_into(worker.agent, views, version, parent_pid)
        bootstrap_value, infos, timings = worker.collect(buffer, version)
        # Everything but the segment memories and the bootstrap value was acted in place.
        with torch.no_grad():
            for dst, src in zip(slot_tensors["memories"], buffer.memories, strict=True):
                tree_map(lambda d, s: d.copy_(s), dst, src)
            slot_tensors["bootstrap_value"].copy_(bootstrap_value)
        buffer.memories = list(slot_tensors["memories"])
        try:
            notices.send(("rollout", (slot, version, timings, wait_s, infos)))
        except (BrokenPipeError, OSError):
            return
        wait_s = 0.0


# ----------------------------------------------------------------------------- the pool


def _send(conn: Connection, message: Any) -> None:
    """Send, ignoring a dead receiver (its process sentinel reports the death)."""
    with contextlib.suppress(BrokenPipeError, OSError):
        conn.send(message)


@dataclass(kw_only=True)
class _ActorHandle(ActorSlot):
    process: Any
    commands: Connection  # parent end: slot grants and commands to the actor
    notices: Connection  # parent end: rollout notices from the actor
    granted: set[int] = field(default_factory=set)  # slots it holds
    ready: bool = False  # built, weights loaded


class ProcessPool(RemotePool):
    """``num_actors`` actor processes feeding a learner through shared-memory slots.

    A :class:`~rltrans.runtime.remote.RemotePool` (its keywords: ``num_actors``,
    ``num_steps``, ``segment_length``, ``seed``, ``torch_threads``, ``max_restarts``,
    ``device``, ``on_info``); actors wait for the first :meth:`publish`. A rollout's tensors
    are views of its slot (copies on ``device`` when that is not the CPU): use them, then
    :meth:`release` it and keep no reference.

    Args:
        slots: shared-memory slots (>= ``num_actors``; default 2 per actor).
        max_policy_lag: drop (and count) rollouts more than that many versions behind the
            last publish in :meth:`get`; None leaves dropping to the caller.
        start_method: ``spawn`` or ``forkserver`` (never ``fork``).
    """

    def __init__(
        self,
        agent_cfg: Mapping[str, Any],
        env_cfg: Mapping[str, Any],
        *,
        slots: int | None = None,
        max_policy_lag: int | None = None,
        start_method: str = "spawn",
        **common: Any,
    ) -> None:
        if start_method == "fork":
            raise ValueError(
                "start_method='fork' is unsafe once torch threads exist (a forked child can "
                "deadlock on a lock a parent thread held); use spawn or forkserver"
            )
        super().__init__(agent_cfg, env_cfg, **common)
        slots = 2 * self.num_actors if slots is None else slots
        if slots < self.num_actors:
            raise ValueError(f"slots={slots} must be >= num_actors={self.num_actors}")
        self.max_policy_lag = max_policy_lag
        self._ctx = tmp.get_context(start_method)
        if start_method == "forkserver":  # the server imports these once; actors fork from it
            self._ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))

        template, state_dict = self._template(self.seed)
        self.num_envs = int(template["bootstrap_value"].shape[0])
        self._layout, self._slot_bytes = slot_layout(template)
        self._block = torch.zeros(slots * self._slot_bytes, dtype=torch.uint8).share_memory_()
        self._views = [
            slot_views(self._block, self._layout, s, self._slot_bytes) for s in range(slots)
        ]
        self._weights = SharedWeights(state_dict, self._ctx)
        self._weight_views = self._weights.views()

        self._free: deque[int] = deque(range(slots))
        self._ready: deque[tuple[int, int, int, list]] = deque()  # actor, slot, version, infos
        self._held: set[int] = set()  # slots the learner holds
        self._created = t0 = time.perf_counter()
        self._start_all()
        self.spawn_s = time.perf_counter() - t0  # to start the processes; they build after
        self._grant()

    @classmethod
    def _options(cls, runtime: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "slots": runtime.get("slots"),
            "start_method": str(runtime.get("start_method", "spawn")),
        }

    # -- set-up

    def _template(self, seed: int) -> tuple[dict[str, Tree], dict[str, Tensor]]:
        """One rollout's tensors and the agent's state_dict, from one env reset and one act
        in this process; the global RNG state is restored afterwards."""
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
                done = torch.ones(n, dtype=torch.bool)
                out, _ = agent.act(obs, state, done)
            finally:
                envs.close()
        # Only shapes and dtypes matter: a buffer with one step and every segment's memory.
        buffer = RolloutBuffer(self.num_steps, n, self.segment_length, "cpu")
        buffer.record_step(0, obs, done, out.action, out.log_prob, out.value)
        buffer.memories = [memory] * len(buffer.memories)
        return rollout_tensors(buffer, torch.zeros(n)), agent.state_dict()

    def _launch(self, i: int, seed: int, incarnation: int = 0) -> _ActorHandle:
        cmd_recv, cmd_send = self._ctx.Pipe(duplex=False)
        note_recv, note_send = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=actor_main,
            name=f"rltrans-actor-{i}",
            args=(
                i, seed, self._spec, self._block, self._layout, self._slot_bytes,
                self._weights, cmd_recv, note_send, os.getpid(),
            ),
            daemon=True,
        )  # fmt: skip
        with _born_ignoring_sigint():
            process.start()
        cmd_recv.close()
        note_send.close()
        return _ActorHandle(
            seed=seed,
            incarnation=incarnation,
            pid=process.pid,
            process=process,
            commands=cmd_send,
            notices=note_recv,
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

    def _take(self) -> Rollout | None:
        """The oldest ready rollout not too stale (stale ones give their slot back)."""
        while self._ready:
            i, slot, version, infos = self._ready.popleft()
            rollout = self._deliver(i, self._views[slot], version, infos, slot)
            if rollout is not None:
                self._held.add(slot)
                return rollout
            self._free.append(slot)
            self._grant()
        if len(self._held) == len(self._views):
            raise RuntimeError("every slot is held by the learner: release() rollouts")
        return None

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until every actor has built its env and agent and loaded the published
        weights (publish first); returns the seconds since the pool was constructed."""
        start = time.perf_counter()
        while not all(a is not None and a.ready for a in self._actors):
            if timeout is not None and time.perf_counter() - start > timeout:
                raise TimeoutError(f"actors not ready within {timeout} s")
            self._poll(0.05)
        return time.perf_counter() - self._created

    def release(self, rollout: Rollout) -> None:
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
                    self._stats.acted(timings, wait_s)
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
            self._fail(
                f"actor {i} failed while starting (exit code {code}); its traceback is above"
            )
        self._restart(i, actor, f"with exit code {code}")
        self._grant()

    # -- control

    def _send_restart(self, actor: _ActorHandle) -> None:
        _send(actor.commands, ("restart", actor.seed))

    def _stop(self, actors: list[_ActorHandle]) -> None:
        """Stop every actor politely, then SIGTERM, then SIGKILL, and wait for them."""
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
