"""The skeleton both remote actor pools share (rltrans.runtime.remote), without processes:
the wire format round-trips a rollout exactly (through a process pool's shared-memory slot and
through host arrays as Ray sends them), and the slot bookkeeping, restarts and closing behave
the same whatever the transport.
"""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
import torch

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.envs import make_env
from rltrans.registry import build_agent
from rltrans.runtime import process, ray_pool, remote
from rltrans.runtime.actors import LocalActor
from rltrans.runtime.pool import Rollout, actor_seed
from rltrans.runtime.ray_pool import to_torch
from rltrans.runtime.remote import (
    ROLLOUT_KEYS,
    ActorSlot,
    RemotePool,
    buffer_from_views,
    episode_info,
    rollout_tensors,
    to_host,
)
from rltrans.runtime.shared import slot_layout, slot_views
from rltrans.types import tree_leaves, tree_map
from tests.runtime.test_process_pool import GTRXL, TMAZE

FIELDS = ("actions", "log_probs", "values", "rewards", "final_values", "terminated", "starts")


@pytest.fixture(scope="module")
def filled():
    """A GTrXL rollout of 8 steps (2 segments) on the T-maze, and its bootstrap value."""
    envs = make_env(TMAZE, seed=0)
    agent = build_agent(GTRXL, envs.single_observation_space, envs.single_action_space)
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    buffer = RolloutBuffer(8, envs.num_envs, 4, "cpu")
    actor.collect(buffer)
    return buffer, actor.bootstrap_value()


def assert_same_rollout(got: RolloutBuffer, want: RolloutBuffer) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for a, b in zip(tree_leaves(got.obs), tree_leaves(want.obs), strict=True):
        assert torch.equal(a, b)
    assert len(got.memories) == len(want.memories) == want.num_steps // want.segment_length
    for mine, theirs in zip(got.memories, want.memories, strict=True):
        for a, b in zip(tree_leaves(mine), tree_leaves(theirs), strict=True):
            assert torch.equal(a, b)


def test_rollout_round_trips_through_a_shared_memory_slot(filled):
    buffer, bootstrap = filled
    sent = rollout_tensors(buffer, bootstrap)
    assert list(sent) == list(ROLLOUT_KEYS)
    layout, slot_bytes = slot_layout(sent)
    block = torch.zeros(2 * slot_bytes, dtype=torch.uint8)
    views = slot_views(block, layout, 1, slot_bytes)  # the second slot: offsets add up
    tree_map(lambda d, s: d.copy_(s), views, sent)
    assert not block[:slot_bytes].any()  # slot 0 untouched
    got = buffer_from_views(slot_views(block, layout, 1, slot_bytes), 8, 4)
    assert_same_rollout(got, buffer)
    assert torch.equal(views["bootstrap_value"], bootstrap)


def test_rollout_round_trips_through_host_arrays(filled):
    """As Ray sends it: NumPy arrays (read-only in the object store), back to writable
    tensors that share nothing with the sender's."""
    buffer, bootstrap = filled
    sent = to_host(rollout_tensors(buffer, bootstrap))
    assert all(isinstance(x, np.ndarray) for x in tree_leaves_any(sent))
    for x in tree_leaves_any(sent):
        x.flags.writeable = False
    got = buffer_from_views(to_torch(sent), 8, 4)
    assert_same_rollout(got, buffer)
    got.rewards.add_(1.0)  # writable, and a copy
    assert not torch.equal(got.rewards, buffer.rewards)
    bf16 = to_host({"w": torch.ones(2, dtype=torch.bfloat16)})["w"]  # NumPy has no bfloat16
    assert isinstance(bf16, torch.Tensor) and bf16.dtype == torch.bfloat16


def tree_leaves_any(tree) -> list:
    out: list = []
    remote.map_leaves(out.append, tree)
    return out


def test_episode_info_keeps_what_the_tracker_reads_on_the_host():
    info = {
        "episode": {"r": torch.tensor([1.0, 2.0]), "l": torch.tensor([3, 4])},
        "_episode": torch.tensor([True, False]),
        "final_info": {"success": torch.tensor([1.0, 0.0]), "other": 1},
        "_final_info": np.array([True, False]),
        "frames": torch.zeros(2, 64, 64),
    }
    kept = episode_info(info)
    assert set(kept) == {"episode", "_episode", "final_info", "_final_info"}
    assert set(kept["final_info"]) == {"success"}
    assert isinstance(kept["episode"]["r"], np.ndarray)
    np.testing.assert_array_equal(kept["episode"]["l"], [3, 4])
    assert episode_info({"frames": 1}) is None  # no episode ended


def test_the_pools_share_the_skeleton_and_not_each_other():
    assert issubclass(process.ProcessPool, RemotePool)
    assert issubclass(ray_pool.RayPool, RemotePool)
    for module, other in ((ray_pool, "rltrans.runtime.process"), (process, "ray_pool")):
        tree = ast.parse(inspect.getsource(module))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not [m for m in imported if m and m.endswith(other)], module.__name__


class FakePool(RemotePool):
    """An in-memory transport: actors are slots, rollouts are what the test queues."""

    def __init__(self, **kwargs) -> None:
        super().__init__({"kind": "memory"}, {"num_envs": 2}, num_steps=8, **kwargs)
        self.num_envs = 2
        self.launched: list[tuple[int, int, int]] = []
        self.inbox: list[Rollout] = []
        self.restarts: list[tuple[int, int]] = []
        self.stopped: list[ActorSlot] | None = None
        self._start_all()

    def _launch(self, i: int, seed: int, incarnation: int = 0) -> ActorSlot:
        self.launched.append((i, seed, incarnation))
        return ActorSlot(seed=seed, incarnation=incarnation, pid=1000 + len(self.launched))

    def _take(self) -> Rollout | None:
        return self.inbox.pop(0) if self.inbox else None

    def _poll(self, timeout: float) -> None:
        pass

    def _send_restart(self, actor: ActorSlot) -> None:
        i = next(i for i, a in enumerate(self._actors) if a is actor)
        self.restarts.append((i, actor.seed))

    def _stop(self, actors: list) -> None:
        self.stopped = actors

    def publish(self, state_dict, version: int) -> None:
        self._published = version


def test_seeds_restarts_and_closing(capfd):
    pool = FakePool(num_actors=2, segment_length=2, seed=5, max_restarts=1)
    assert pool.launched == [(0, actor_seed(5, 0, 2), 0), (1, actor_seed(5, 1, 2), 0)]
    with pytest.raises(RuntimeError, match=r"publish\(\) the weights before get"):
        pool.get()
    pool.publish({}, 0)
    with pytest.raises(TimeoutError, match="no rollout within 0.01 s"):
        pool.get(timeout=0.01)

    pool._restart(1, pool._actors[1], "with exit code -9")
    base = actor_seed(5, 1, 2)
    assert pool.launched[-1] == (1, base + 1_000_003, 1)
    assert pool._actors[1].seed == base  # the next restart derives from the base seed too
    assert "actor 1 (pid 1002) died with exit code -9; restarting it with seed" in (
        capfd.readouterr().err
    )
    pool.restart_envs(seed=9)
    assert pool.restarts == [(0, actor_seed(9, 0, 2)), (1, actor_seed(9, 1, 2))]
    assert pool.stats()["restarts"] == 1

    live = list(pool._actors)
    with pytest.raises(RuntimeError, match=r"actor 1 died 2 times, the last boom.*max_restarts=1"):
        pool._restart(1, pool._actors[1], "boom")
    assert pool._closed and pool.stopped == live and pool.pids == [None, None]
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="FakePool is closed"):
        pool.get()


def test_delivery_counts_lag_drops_stale_rollouts_and_reports_every_episode(filled):
    buffer, bootstrap = filled
    infos: list = []
    pool = FakePool(num_actors=1, segment_length=4, seed=0, on_info=infos.append)
    pool.max_policy_lag = 1
    pool.publish({}, 3)
    views = rollout_tensors(buffer, bootstrap)
    assert pool._deliver(0, views, 1, [{"episode": 1}]) is None  # lag 2: dropped, counted
    rollout = pool._deliver(0, views, 2, [{"episode": 2}], slot=7)
    assert (rollout.actor_id, rollout.policy_version, rollout.slot) == (0, 2, 7)
    assert rollout.buffer.policy_version == 2
    assert_same_rollout(rollout.buffer, buffer)
    stats = pool.stats()
    assert infos == [{"episode": 1}, {"episode": 2}]  # dropped rollouts' episodes count too
    assert stats["dropped"] == 1 and stats["rollouts"] == 1 and stats["policy_lag_hist/1"] == 1
    pool.close()
