"""ProcessPool: actor processes writing rollouts into shared-memory slots (IMPALA's runtime).

Each test starts real (spawned) processes, so each is bounded by a timeout and checks that
no child process is left behind.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing import forkserver, resource_tracker
from pathlib import Path

import pytest
import torch

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.envs import make_env
from rltrans.registry import build_agent
from rltrans.run.context import seed_everything
from rltrans.run.logging import EpisodeTracker
from rltrans.runtime.actors import LocalActor
from rltrans.runtime.process import ProcessPool
from rltrans.types import tree_leaves

try:  # pytest-timeout (a dev dependency); every wait below has its own timeout anyway
    import pytest_timeout  # noqa: F401

    pytestmark = pytest.mark.timeout(90)
except ImportError:
    pytestmark = []

CARTPOLE = {"kind": "gym", "id": "CartPole-v1", "num_envs": 2}
TMAZE = {"kind": "torch", "name": "tmaze", "num_envs": 2, "kwargs": {"length": 4}}
MLP = {"kind": "memory", "backbone": "mlp", "dim": 8, "layers": 1, "encoder": {"hidden_dim": 8}}
GTRXL = {
    "kind": "memory",
    "backbone": "gtrxl",
    "dim": 8,
    "layers": 1,
    "heads": 2,
    "memory": 4,
    "encoder": {"hidden_dim": 8},
}


def _descendants(pid: int) -> list[int]:
    """Live descendant process ids, from /proc (psutil is not a dependency)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


def _leftovers(before: set[int]) -> set[int]:
    """Descendants that were not there before, except multiprocessing's own helpers, the
    resource tracker and the fork server (started once; they exit with this process)."""
    helpers = {
        getattr(resource_tracker._resource_tracker, "_pid", None),
        getattr(forkserver._forkserver, "_forkserver_pid", None),
    }
    return set(_descendants(os.getpid())) - before - helpers


@pytest.fixture(autouse=True)
def _no_orphans():
    """Every test must leave no child process alive."""
    before = set(_descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 5
    while _leftovers(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not multiprocessing.active_children()
    assert not _leftovers(before)


def _agent(agent_cfg, env_cfg):
    envs = make_env(env_cfg, seed=0)
    agent = build_agent(agent_cfg, envs.single_observation_space, envs.single_action_space)
    envs.close()
    return agent


@pytest.mark.cli
def test_first_rollout_equals_local_actor():
    """One actor, same seed and weights: the pool's first rollout is the parent's LocalActor's."""
    seed, steps, seg = 3, 16, 8
    agent = _agent(GTRXL, TMAZE)
    with ProcessPool(
        GTRXL, TMAZE, num_actors=1, num_steps=steps, segment_length=seg, seed=seed
    ) as pool:
        pool.publish(agent.state_dict(), 0)
        rollout = pool.get(timeout=30)
        got = rollout.buffer

        envs = make_env(TMAZE, seed=seed)
        reference = _agent(GTRXL, TMAZE)
        reference.load_state_dict(agent.state_dict())
        seed_everything(seed)
        actor = LocalActor(envs, reference, seed=seed, device="cpu")
        want = RolloutBuffer(steps, envs.num_envs, seg, "cpu")
        actor.collect(want)

        assert rollout.policy_version == got.policy_version == 0
        assert rollout.actor_id == 0 and pool.num_envs == 2
        for name in ("obs", "actions", "log_probs", "values", "rewards", "starts", "terminated"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-6, rtol=0)
        for mine, theirs in zip(got.memories, want.memories, strict=True):
            for a, b in zip(tree_leaves(mine), tree_leaves(theirs), strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            rollout.bootstrap_value, actor.bootstrap_value(), atol=1e-6, rtol=0
        )
        pool.release(rollout)
        stats = pool.stats()
        assert stats["rollouts"] == 1 and stats["actor_restarts"] == 0
        assert stats["env_ms"] > 0 and stats["act_ms"] > 0


@pytest.mark.cli
def test_versions_follow_publish_and_stale_rollouts_are_dropped():
    agent = _agent(MLP, CARTPOLE)
    tracker = EpisodeTracker(window=100)
    with ProcessPool(
        MLP,
        CARTPOLE,
        num_actors=1,
        num_steps=8,
        segment_length=8,
        seed=0,
        max_policy_lag=1,
        on_info=tracker.update,
    ) as pool:
        pool.publish(agent.state_dict(), 0)
        first = pool.get(timeout=30)
        assert first.policy_version == 0
        deadline = time.monotonic() + 20  # the actor's second slot fills with version 0
        while not pool._ready and time.monotonic() < deadline:
            pool._poll(0.1)
        assert pool._ready
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(1.0)
        pool.publish(agent.state_dict(), 5)
        pool.release(first)
        fresh = pool.get(timeout=30)  # the version-0 rollout (lag 5 > 1) is dropped
        assert fresh.policy_version == fresh.buffer.policy_version == 5
        state = agent.initial_state(pool.num_envs)  # the mlp's value depends on obs only
        for t in range(fresh.buffer.num_steps):  # acted with the published weights
            value = agent.peek_value(fresh.buffer.obs[t], state)
            torch.testing.assert_close(fresh.buffer.values[t], value, atol=1e-5, rtol=0)
        stats = pool.stats()
        assert stats["dropped"] >= 1
        assert stats["policy_lag_hist/0"] == 2 and stats["policy_lag_max"] == 0
        pool.release(fresh)
        pool.publish(agent.state_dict(), 6)  # rollouts in flight with version 5: lag 1, kept
        for _ in range(3):
            rollout = pool.get(timeout=30)
            assert pool._published - rollout.policy_version <= 1
            pool.release(rollout)
        with pytest.raises(ValueError, match="not held"):
            pool.release(rollout)

        pool.restart_envs(seed=7)  # applies from each actor's next rollout
        envs = make_env(CARTPOLE, seed=7)
        fresh_obs = torch.as_tensor(envs.reset(seed=7)[0], dtype=torch.float32)
        restarted = []
        for _ in range(4):  # at most 2 rollouts were under way when the command arrived
            rollout = pool.get(timeout=30)
            restarted.append(torch.equal(rollout.buffer.obs[0], fresh_obs))
            pool.release(rollout)
        assert any(restarted)
        assert tracker.episodes_seen > 0 and 8 <= tracker.mean_length <= 100


@pytest.mark.cli
def test_two_actors_seeds_sigkill_restart_and_close(capfd):
    """Forkserver here (the other tests spawn): actors and the restart start in ~0.1 s."""
    agent = _agent(MLP, CARTPOLE)
    pool = ProcessPool(
        MLP,
        CARTPOLE,
        num_actors=2,
        num_steps=8,
        segment_length=8,
        seed=1,
        start_method="forkserver",
    )
    try:
        pool.publish(agent.state_dict(), 0)
        first: dict[int, torch.Tensor] = {}
        while len(first) < 2:
            rollout = pool.get(timeout=30)
            first.setdefault(rollout.actor_id, rollout.buffer.obs[0].clone())
            pool.release(rollout)
        assert not torch.equal(first[0], first[1])  # seeds 1 and 1001

        victim = pool.pids[1]
        os.kill(victim, signal.SIGKILL)
        seen_after = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            pool.stats()["actor_restarts"] >= 1 and seen_after >= {0, 1}
        ):
            rollout = pool.get(timeout=30)
            if pool.stats()["actor_restarts"] >= 1:
                seen_after.add(rollout.actor_id)
            pool.release(rollout)
        assert pool.stats()["actor_restarts"] == 1
        assert seen_after == {0, 1}  # the restarted actor delivers again
        assert pool.pids[1] != victim
        assert "actor 1" in capfd.readouterr().err
        children = pool.pids
    finally:
        pool.close()
    assert not multiprocessing.active_children()
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid)


@pytest.mark.cli
def test_actor_deaths_beyond_max_restarts_stop_the_pool():
    agent = _agent(MLP, CARTPOLE)
    pool = ProcessPool(
        MLP, CARTPOLE, num_actors=1, num_steps=8, segment_length=8, seed=0, max_restarts=0
    )
    with pool:
        pool.publish(agent.state_dict(), 0)
        pool.release(pool.get(timeout=30))
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"actor 0 died 1 times.*max_restarts=0"):
            for _ in range(100):  # rollouts already made may still come first
                pool.release(pool.get(timeout=30))
        assert pool._closed  # the pool stopped its actors before raising


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"
