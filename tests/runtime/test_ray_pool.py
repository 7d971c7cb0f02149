"""RayPool: IMPALA's actors as Ray actors (``runtime=ray``), rollouts through Ray's object store.

One Ray instance serves the whole module (starting one takes ~7 s here); each test is bounded
by a timeout, since a Ray start or call that goes wrong can wait forever.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import time

import pytest
import torch

ray = pytest.importorskip(
    "ray", reason='runtime=ray needs Ray: pip install -e ".[ray]" (or "rltrans[ray]")'
)

import rltrans  # noqa: E402
from rltrans.buffers.rollout import RolloutBuffer  # noqa: E402
from rltrans.config import ConfigError  # noqa: E402
from rltrans.envs import make_env  # noqa: E402
from rltrans.registry import build_agent  # noqa: E402
from rltrans.run.context import seed_everything  # noqa: E402
from rltrans.run.logging import EpisodeTracker  # noqa: E402
from rltrans.runtime import ray_pool  # noqa: E402
from rltrans.runtime.actors import LocalActor  # noqa: E402
from rltrans.runtime.pool import actor_seed  # noqa: E402
from rltrans.runtime.ray_pool import RayPool, init_ray  # noqa: E402
from rltrans.types import tree_leaves  # noqa: E402
from tests.runtime.test_process_pool import (  # noqa: E402
    CARTPOLE,
    GTRXL,
    MLP,
    TMAZE,
    _descendants,
)


def _agent(agent_cfg, env_cfg):
    envs = make_env(env_cfg, seed=0)
    agent = build_agent(agent_cfg, envs.single_observation_space, envs.single_action_space)
    envs.close()
    return agent


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module (pools use it and leave it running); shut down
    at the end, leaving no Ray process behind."""
    if ray.is_initialized():
        ray.shutdown()
    before = set(_descendants(os.getpid()))
    assert init_ray(None, num_cpus=4, object_store_memory=128 * 2**20)
    yield
    ray.shutdown()
    deadline = time.monotonic() + 15
    while set(_descendants(os.getpid())) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(_descendants(os.getpid())) - before


@pytest.fixture(scope="module")
def cartpole(ray_instance):
    """A 2-actor pool on CartPole shared by the tests below it, and its episode tracker."""
    tracker = EpisodeTracker(window=100)
    pool = RayPool(
        MLP,
        CARTPOLE,
        num_actors=2,
        num_steps=8,
        segment_length=4,
        seed=1,
        max_restarts=1,
        on_info=tracker.update,
    )
    yield pool, tracker
    pool.close()


@pytest.mark.timeout(60)
def test_importing_needs_no_ray_and_a_missing_ray_says_how_to_install(monkeypatch):
    tree = ast.parse(inspect.getsource(ray_pool))
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in top_level for a in n.names] + [
        n.module for n in top_level if isinstance(n, ast.ImportFrom)
    ]
    assert not [n for n in names if n and n.split(".")[0] == "ray"]

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r'pip install "rltrans\[ray\]"'):
        ray_pool.import_ray()
    from rltrans.trainers.impala import build_pool

    plan = rltrans.plan("algo=impala", "runtime=ray", "env=gym", "env.id=CartPole-v1")
    with pytest.raises(ConfigError, match=r"runtime=ray needs Ray.*\.\[ray\]"):
        build_pool(plan, None, [], seed=0, device=torch.device("cpu"), on_info=print)


@pytest.mark.timeout(120)
def test_first_rollout_equals_local_actor(ray_instance):
    """One actor, same seed and weights: the pool's first rollout is this process's
    LocalActor's, exactly (GTrXL: memories included)."""
    seed, steps, seg = 3, 8, 4
    agent = _agent(GTRXL, TMAZE)
    with torch.no_grad():  # weights unlike the actor's own initial ones
        for p in agent.parameters():
            p.add_(0.01 * torch.randn_like(p))
    with RayPool(
        GTRXL, TMAZE, num_actors=1, num_steps=steps, segment_length=seg, seed=seed
    ) as pool:
        pool.publish(agent.state_dict(), 0)
        rollout = pool.get(timeout=60)
        got = rollout.buffer

        envs = make_env(TMAZE, seed=seed)
        reference = _agent(GTRXL, TMAZE)
        reference.load_state_dict(agent.state_dict())
        seed_everything(seed)
        actor = LocalActor(envs, reference, seed=actor_seed(seed, 0, envs.num_envs), device="cpu")
        want = RolloutBuffer(steps, envs.num_envs, seg, "cpu")
        actor.collect(want)

        assert rollout.policy_version == got.policy_version == 0
        assert rollout.actor_id == 0 and pool.num_envs == 2 and rollout.slot is None
        fields = ("actions", "log_probs", "values", "rewards", "final_values")
        for name in (*fields, "starts", "terminated", "truncated"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        for mine, theirs in zip(tree_leaves(got.obs), tree_leaves(want.obs), strict=True):
            assert torch.equal(mine, theirs)
        assert len(got.memories) == steps // seg
        for mine, theirs in zip(got.memories, want.memories, strict=True):
            for a, b in zip(tree_leaves(mine), tree_leaves(theirs), strict=True):
                assert torch.equal(a, b)
        assert torch.equal(rollout.bootstrap_value, actor.bootstrap_value())
        got.rewards.mul_(2.0)  # the learner's own writable copy (the trainer scales in place)
        pool.release(rollout)
        stats = pool.stats()
        assert stats["rollouts"] == 1 and stats["restarts"] == 0 and stats["dropped"] == 0
        assert stats["env_ms"] > 0 and stats["act_ms"] > 0 and stats["queue_wait_ms"] > 0
        pool.close()
        pool.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            pool.get()
    assert ray.is_initialized()  # not the pool's instance: left running


@pytest.mark.timeout(120)
def test_published_weights_reach_later_rollouts_and_lag_is_measured(ray_instance, cartpole):
    pool, tracker = cartpole
    agent = _agent(MLP, CARTPOLE)
    pool.publish(agent.state_dict(), 0)
    first = pool.get(timeout=60)
    pool.release(first)
    pool.stats()  # start the lag histogram here
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(1.0)
    pool.publish(agent.state_dict(), 5)
    versions = []
    while not versions or versions[-1] != 5:  # calls queued with version 0 come first
        rollout = pool.get(timeout=60)
        versions.append(rollout.policy_version)
        assert len(versions) <= 2 * pool.rollouts_in_flight + 1, versions
    assert len(versions) > 1 and set(versions[:-1]) == {0}
    fresh = rollout.buffer
    assert fresh.policy_version == 5
    state = agent.initial_state(pool.num_envs)  # the mlp's value depends on obs only
    for t in range(fresh.num_steps):  # acted with the published weights
        value = agent.peek_value(fresh.obs[t], state)
        torch.testing.assert_close(fresh.values[t], value, atol=1e-5, rtol=0)
    stats = pool.stats()
    assert stats["policy_lag_max"] == 5
    assert stats["policy_lag_hist/0"] == 1
    assert stats["policy_lag_mean"] == pytest.approx(5 * (len(versions) - 1) / len(versions))

    pool.restart_envs(seed=7)  # after the calls already queued
    envs = make_env(CARTPOLE, seed=7)
    fresh_obs = torch.as_tensor(envs.reset(seed=7)[0], dtype=torch.float32)
    envs.close()
    restarted = []  # actor 0's next rollouts: fresh from seed 7 once its queued calls are done
    for _ in range(100):
        rollout = pool.get(timeout=60)
        if rollout.actor_id == 0:
            restarted.append(torch.equal(rollout.buffer.obs[0], fresh_obs))
        if len(restarted) > pool.rollouts_in_flight:
            break
    assert restarted == [False] * pool.rollouts_in_flight + [True]
    assert tracker.episodes_seen > 0 and 8 <= tracker.mean_length <= 500


@pytest.mark.timeout(240)
def test_a_killed_actor_is_reported_and_restarted(ray_instance, cartpole, capfd):
    pool, _ = cartpole
    agent = _agent(MLP, CARTPOLE)
    pool.publish(agent.state_dict(), 10)
    pool.get(timeout=60)
    victim = pool.handles[1]
    ray.kill(victim)
    seen_after: set[int] = set()
    # A new actor process imports torch and builds its envs first: on a loaded 2-core machine
    # that took over a minute, so the restarted actor gets longer than the others' rollouts.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not seen_after >= {0, 1}:
        rollout = pool.get(timeout=60)  # never stalls: actor 0 delivers meanwhile
        if pool.stats()["restarts"] >= 1:
            seen_after.add(rollout.actor_id)
    stats = pool.stats()
    assert stats["restarts"] == 1 and stats["lost"] >= 1
    assert seen_after == {0, 1}  # the new actor 1 delivers
    assert pool.handles[1] is not victim
    err = capfd.readouterr().err
    assert "actor 1" in err and "restarting it with seed" in err

    ray.kill(pool.handles[1])  # a second death is one more than max_restarts=1
    with pytest.raises(RuntimeError, match=r"actor 1 died 2 times.*max_restarts=1"):
        for _ in range(100):  # actor 0's rollouts may come first
            pool.get(timeout=60)
    assert pool._closed  # the pool killed its actors before raising
    assert ray.is_initialized()
