"""Actor pools: where IMPALA's rollouts come from, behind one interface.

A pool hands the trainer filled rollouts (:meth:`ActorPool.get`), each with the version of
the weights that acted, and takes new weights (:meth:`ActorPool.publish`). Every actor acts
through the one acting loop (:class:`~rltrans.runtime.actors.LocalActor` over
:class:`~rltrans.runtime.episodes.EpisodeLoop`); pools only differ in where actors run:

- :class:`LocalPool` (``runtime=local``): ``num_actors`` actors in the training process,
  stepped round-robin with the learner's own module: deterministic, policy lag 0.
- ``ProcessPool`` (``runtime=process``, :mod:`rltrans.runtime.process`): actor processes
  filling shared-memory slots (``Rollout.slot``) while the learner trains.
- ``RayPool`` (``runtime=ray``, :mod:`rltrans.runtime.ray_pool`): Ray actors, rollouts
  through Ray's object store.

The two remote pools share one skeleton (actor slots, wire format, restarts, closing,
``from_config``): ``RemotePool`` of :mod:`rltrans.runtime.remote`.

Episode statistics reach the trainer through the ``on_info`` callback a pool is built with:
it sees the Gymnasium info dict of every env step of a rollout before :meth:`ActorPool.get`
returns that rollout, in the trainer's thread. Rewards in a rollout are the env's own
(unscaled): the trainer scales them (one running scaler per actor, kept in its checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from rltrans.accel.threads import AUTO
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import to_container
from rltrans.envs.gym_vec import close_envs
from rltrans.runtime.actors import LocalActor


@dataclass
class Rollout:
    """One actor's filled rollout."""

    buffer: RolloutBuffer  # T steps x N envs of one actor, incl. segment memories
    bootstrap_value: Tensor  # (N,) V of the observation after the rollout, behaviour weights
    policy_version: int  # learner version whose weights acted
    actor_id: int
    slot: int | None = None  # shared-memory slot to hand back (process runtime), else None


class ActorPool(Protocol):
    """The actor/learner seam of IMPALA: weights (with a version) in, rollouts out."""

    num_envs: int  # envs per rollout (N)

    def publish(self, state_dict: dict[str, Tensor], version: int) -> None: ...

    def get(self) -> Rollout: ...  # the next filled rollout (blocks)

    def release(self, rollout: Rollout) -> None: ...  # hand its storage back

    def stats(self) -> dict[str, float]: ...  # restarts, dropped, queue_wait_ms, ...

    def restart_envs(self, seed: int) -> None: ...  # fresh episodes (after checkpoints)

    # cut_short: after a signal, which may have cut a call to an env short (see
    # rltrans.envs.gym_vec.close_envs); remote pools stop their actors either way.
    def close(self, cut_short: bool = False) -> None: ...


def plain(cfg: Any) -> dict[str, Any]:
    """A plain dict of a config section (resolved), as actors in other processes receive it."""
    return to_container(cfg)


def pool_arguments(cfg: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """What every actor pool reads of a training config: the env config each actor builds
    (``runtime.envs_per_actor`` applied), the keyword arguments all pools share
    (``num_actors``, ``num_steps``, ``segment_length``, ``torch_threads``, ``max_restarts``),
    and the ``runtime`` section for the pool's own keys (an empty dict when absent)."""
    runtime, threads = cfg.get("runtime") or {}, cfg.get("torch_threads", 1)
    env_cfg = plain(cfg.env)
    if runtime.get("envs_per_actor"):
        env_cfg["num_envs"] = int(runtime["envs_per_actor"])
    shared = {
        "num_actors": int(runtime.get("num_actors", 1)),
        "num_steps": int(cfg.algo.num_steps),
        "segment_length": int(cfg.algo.segment_length),
        # Actor processes share the cores with each other and the learner: auto = one each.
        "torch_threads": 1 if threads in (None, 0, AUTO) else int(threads),
        "max_restarts": int(runtime.get("max_restarts", 10)),
    }
    return env_cfg, shared, runtime


def actor_seed(seed: int, actor_id: int, num_envs: int) -> int:
    """Reset seed of actor ``actor_id``: its sub-envs get seeds disjoint from other actors'."""
    return seed + actor_id * num_envs


class LocalPool:
    """``num_actors`` :class:`LocalActor` in this process sharing the learner's agent, each
    with its own vector env; :meth:`get` fills the next actor's rollout (round-robin).

    Weights are shared, so :meth:`publish` only records the version: every rollout is acted
    by the latest weights (lag 0). Buffers are reused once released.
    """

    def __init__(
        self,
        envs: Sequence[VectorEnv],
        agent: torch.nn.Module,
        *,
        num_steps: int,
        segment_length: int,
        seed: int,
        device: torch.device | str,
        on_info: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if not envs:
            raise ValueError("a LocalPool needs at least one vector env")
        sizes = {e.num_envs for e in envs}
        if len(sizes) != 1:
            raise ValueError(f"every actor's vector env needs the same num_envs, got {sizes}")
        self.envs, self.agent, self.device = list(envs), agent, torch.device(device)
        self.num_envs = sizes.pop()
        self.num_steps, self.segment_length = num_steps, segment_length
        self.on_info = on_info
        self.actors = [
            LocalActor(e, agent, seed=actor_seed(seed, i, self.num_envs), device=self.device)
            for i, e in enumerate(self.envs)
        ]
        self.version = 0
        self.next_actor = 0
        self.free: list[RolloutBuffer] = []

    def publish(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """The actors act with the learner's module itself: only the version moves."""
        self.version = version
        for actor in self.actors:
            actor.set_policy_version(version)

    def get(self) -> Rollout:
        """Fill a rollout with the next actor (round-robin) and return it."""
        actor_id = self.next_actor
        self.next_actor = (self.next_actor + 1) % len(self.actors)
        actor = self.actors[actor_id]
        buffer = self.free.pop() if self.free else self._new_buffer()
        actor.collect(buffer, on_info=self.on_info)
        rollout = Rollout(buffer, actor.bootstrap_value(), buffer.policy_version, actor_id)
        return rollout

    def _new_buffer(self) -> RolloutBuffer:
        return RolloutBuffer(self.num_steps, self.num_envs, self.segment_length, self.device)

    def release(self, rollout: Rollout) -> None:
        """Reuse the rollout's buffer for a later :meth:`get`."""
        self.free.append(rollout.buffer)

    def stats(self) -> dict[str, float]:
        """Since the last call: env and acting time (ms), waits (none: acting is inline)."""
        env = act = 0.0
        for actor in self.actors:
            timings = actor.pop_timings()
            env, act = env + timings["env"], act + timings["act"]
        return {
            "env_ms": 1e3 * env,
            "act_ms": 1e3 * act,
            "queue_wait_ms": 0.0,
            "restarts": 0.0,
            "dropped": 0.0,
        }

    def restart_envs(self, seed: int) -> None:
        """Every actor resets its envs and starts fresh episodes and memory."""
        for i, actor in enumerate(self.actors):
            actor.restart(seed=actor_seed(seed, i, self.num_envs))
        self.next_actor = 0

    def close(self, cut_short: bool = False) -> None:
        """Close every actor's envs; ``cut_short`` (after a signal): without awaiting a call
        the signal may have cut short (an async env's workers are terminated)."""
        for e in self.envs:
            close_envs(e, cut_short=cut_short)
