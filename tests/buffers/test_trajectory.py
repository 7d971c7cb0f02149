"""TrajectoryBuffer: K-step windows against naive per-episode loops."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.buffers.trajectory import (
    TrajectoryBuffer,
    TrajectoryStats,
    normalizes_states,
    policy_observation_space,
)
from rltrans.envs.dqn_replay import stack_frames
from rltrans.envs.offline import Episode, OfflineDataset

VECTOR = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


def vector_dataset(lengths, *, continuous: bool = False, seed: int = 0) -> OfflineDataset:
    """Episodes whose states spell out (episode id, step, noise), so windows can be decoded."""
    rng = np.random.default_rng(seed)
    episodes = []
    for e, t_len in enumerate(lengths):
        t = np.arange(t_len)
        obs = np.stack([np.full(t_len, e), t, rng.normal(size=t_len)], axis=1).astype(np.float32)
        if continuous:
            actions = rng.uniform(-1, 1, size=(t_len, 2)).astype(np.float32)
        else:
            actions = rng.integers(0, 4, size=t_len)
        rewards = rng.integers(-3, 5, size=t_len).astype(np.float32)
        episodes.append(Episode(obs, actions, rewards, terminated=True))
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32) if continuous else gym.spaces.Discrete(4)
    return OfflineDataset(episodes, VECTOR, action_space, name="synthetic")


def decode(batch, b: int, j: int) -> tuple[int, int]:
    """Episode id and step of window b, slot j (from the state contents)."""
    return int(batch.states[b, j, 0]), int(batch.states[b, j, 1])


def test_shapes_and_dtypes_discrete_and_continuous():
    for continuous in (False, True):
        ds = vector_dataset([7, 12], continuous=continuous)
        batch = TrajectoryBuffer(ds, context=5).sample(9)
        assert batch.states.shape == (9, 5, 3) and batch.states.dtype == torch.float32
        assert batch.returns_to_go.shape == (9, 5, 1)
        assert batch.timesteps.shape == (9, 5) and batch.timesteps.dtype == torch.long
        assert batch.mask.shape == (9, 5) and batch.mask.dtype == torch.bool
        if continuous:
            assert batch.actions.shape == (9, 5, 2) and batch.actions.dtype == torch.float32
        else:
            assert batch.actions.shape == (9, 5) and batch.actions.dtype == torch.long
        assert batch.batch_size == 9 and batch.context == 5


@pytest.mark.parametrize("continuous", [False, True])
def test_windows_match_naive_loop(continuous):
    """Every real slot holds the episode's step; RTG equals a naive sum; padding is zero."""
    ds = vector_dataset([3, 9, 20], continuous=continuous)
    k = 6
    batch = TrajectoryBuffer(ds, context=k).sample(200, np.random.default_rng(1))
    saw_padding = False
    for b in range(200):
        mask = batch.mask[b].numpy()
        pad = int((~mask).sum())
        saw_padding |= pad > 0
        # Left padding: False ... False True ... True.
        assert mask.tolist() == [False] * pad + [True] * (k - pad)
        ep_id, start = decode(batch, b, pad)
        ep = ds.episodes[ep_id]
        # Cut only by the episode end: real length = min(K, steps left from the start).
        assert k - pad == min(k, len(ep) - start)
        for j in range(pad, k):
            t = start + j - pad
            assert decode(batch, b, j) == (ep_id, t)
            naive = 0.0
            for r in ep.rewards[t:]:
                naive += float(r)
            assert batch.returns_to_go[b, j, 0].item() == pytest.approx(naive)
            assert batch.timesteps[b, j].item() == t
            np.testing.assert_array_equal(batch.actions[b, j].numpy(), ep.actions[t])
        # Padded slots hold zeros everywhere.
        assert not batch.states[b, :pad].any() and not batch.actions[b, :pad].any()
        assert not batch.returns_to_go[b, :pad].any() and not batch.timesteps[b, :pad].any()
    assert saw_padding  # the 3-step episode pads every window


def test_sampling_proportional_to_length_and_uniform_start():
    lengths = [10, 30, 60]
    ds = vector_dataset(lengths)
    n = 30_000
    batch = TrajectoryBuffer(ds, context=4).sample(n, np.random.default_rng(123))
    first = (~batch.mask).sum(dim=1)  # (B,) slot of the first real step
    rows = torch.arange(n)
    episode = batch.states[rows, first, 0].long().numpy()
    start = batch.states[rows, first, 1].long().numpy()
    freq = np.bincount(episode, minlength=3) / n
    # Binomial sd <= 0.003 at n = 30k: 0.015 is a 5-sigma band.
    np.testing.assert_allclose(freq, np.array(lengths) / sum(lengths), atol=0.015)
    # Starts inside the longest episode are uniform over its 60 steps (chi-square, 59 dof:
    # mean 59, sd 11; 120 is beyond 5 sd).
    counts = np.bincount(start[episode == 2], minlength=60)
    expected = counts.sum() / 60
    assert ((counts - expected) ** 2 / expected).sum() < 120


def test_same_generator_seed_same_batch():
    buffer = TrajectoryBuffer(vector_dataset([5, 8]), context=3)
    a = buffer.sample(16, np.random.default_rng(7))
    b = buffer.sample(16, np.random.default_rng(7))
    assert torch.equal(a.states, b.states) and torch.equal(a.mask, b.mask)


def test_timesteps_clamped_to_max_timestep():
    buffer = TrajectoryBuffer(vector_dataset([20]), context=8, max_timestep=7)
    batch = buffer.sample(100, np.random.default_rng(0))
    steps = batch.states[..., 1].long()
    real = batch.mask
    assert torch.equal(batch.timesteps[real], steps[real].clamp(max=6))
    assert batch.timesteps.max().item() == 6
    # Default: the longest episode of the data.
    assert TrajectoryBuffer(vector_dataset([4, 11]), context=2).max_timestep == 11


def test_stats_values_and_round_trip(tmp_path):
    ds = vector_dataset([6, 9])
    buffer = TrajectoryBuffer(ds, context=3)
    stats = buffer.stats()
    obs = np.concatenate([ep.observations for ep in ds.episodes]).astype(np.float64)
    np.testing.assert_allclose(stats["state_mean"].numpy(), obs.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["state_std"].numpy(), obs.std(0) + 1e-6, rtol=1e-6)
    assert stats["return_scale"] == pytest.approx(np.abs(ds.returns()).max())
    assert stats["max_timestep"] == 9

    torch.save(stats, tmp_path / "stats.pt")
    loaded = torch.load(tmp_path / "stats.pt", weights_only=True)
    restored = TrajectoryStats.from_stats(loaded)
    assert torch.equal(restored.state_mean, stats["state_mean"])
    assert torch.equal(restored.state_std, stats["state_std"])
    assert restored.return_scale == stats["return_scale"]
    assert restored.as_dict().keys() == stats.keys()

    assert TrajectoryBuffer(ds, context=3, return_scale=1000.0).stats()["return_scale"] == 1000.0
    with pytest.raises(ValueError, match="expected exactly"):
        TrajectoryStats.from_stats({"state_mean": torch.zeros(3)})
    with pytest.raises(ValueError, match="return_scale"):
        TrajectoryBuffer(ds, context=3, return_scale=-1.0)


def atari_dataset(lengths, frame_stack: int = 4, seed: int = 0) -> OfflineDataset:
    """uint8 frames (T, 6, 6), random, with pixel (0, 0) = 50 * episode + step."""
    rng = np.random.default_rng(seed)
    episodes = []
    for e, t_len in enumerate(lengths):
        frames = rng.integers(0, 256, size=(t_len, 6, 6), dtype=np.uint8)
        frames[:, 0, 0] = 50 * e + np.arange(t_len)
        episodes.append(Episode(frames, rng.integers(0, 3, t_len), np.ones(t_len)))
    space = gym.spaces.Box(0, 255, (6, 6), np.uint8)
    return OfflineDataset(episodes, space, gym.spaces.Discrete(3), frame_stack=frame_stack)


def test_atari_windows_equal_stack_frames():
    ds = atari_dataset([4, 15, 40])
    buffer = TrajectoryBuffer(ds, context=6)
    assert buffer.observation_space.shape == (4, 6, 6)
    batch = buffer.sample(64, np.random.default_rng(3))
    assert batch.states.shape == (64, 6, 4, 6, 6) and batch.states.dtype == torch.uint8
    stats = buffer.stats()
    assert stats["state_mean"].shape == () and stats["state_std"].item() == 1.0  # no normalising
    for b in range(64):
        pad = int((~batch.mask[b]).sum())
        assert not batch.states[b, :pad].any()
        for j in range(pad, 6):
            code = int(batch.states[b, j, -1, 0, 0])  # newest frame of the stack
            ep, t = divmod(code, 50)
            assert batch.timesteps[b, j].item() == t
            expected = stack_frames(ds.episodes[ep].observations, t, 4)
            np.testing.assert_array_equal(batch.states[b, j].numpy(), expected)


def test_image_rows_without_frame_stack():
    ds = atari_dataset([5, 7], frame_stack=1)
    batch = TrajectoryBuffer(ds, context=3).sample(20, np.random.default_rng(0))
    assert batch.states.shape == (20, 3, 6, 6)
    for b in range(20):
        for j in torch.nonzero(batch.mask[b]).flatten().tolist():
            ep, t = divmod(int(batch.states[b, j, 0, 0]), 50)
            np.testing.assert_array_equal(
                batch.states[b, j].numpy(), ds.episodes[ep].observations[t]
            )


def test_top_fraction_samples_only_best_episodes():
    ds = vector_dataset([10, 10, 10, 10], seed=2)
    best = int(np.argmax(ds.returns()))
    buffer = TrajectoryBuffer(ds, context=2, top_fraction=0.25)
    batch = buffer.sample(200, np.random.default_rng(0))
    episodes = batch.states[..., 0][batch.mask].long().unique().tolist()
    assert episodes == [best]
    # Half of the steps: the two best episodes.
    two = TrajectoryBuffer(ds, context=2, top_fraction=0.5).sample(400, np.random.default_rng(0))
    picked = set(two.states[..., 0][two.mask].long().unique().tolist())
    assert picked == set(np.argsort(-ds.returns())[:2].tolist())
    # Statistics still cover every episode.
    assert buffer.stats()["max_timestep"] == 10
    assert buffer.stats()["return_scale"] == pytest.approx(np.abs(ds.returns()).max())


def test_policy_space_and_normalisation_rule():
    ds = atari_dataset([3])
    space = policy_observation_space(ds)
    assert space.shape == (4, 6, 6) and space.dtype == np.uint8
    assert policy_observation_space(vector_dataset([3])) is VECTOR
    assert normalizes_states(VECTOR) and not normalizes_states(space)
    assert not normalizes_states(gym.spaces.Discrete(5))


def test_bad_arguments_are_named():
    ds = vector_dataset([3])
    with pytest.raises(ValueError, match="context"):
        TrajectoryBuffer(ds, context=0)
    with pytest.raises(ValueError, match="top_fraction"):
        TrajectoryBuffer(ds, context=2, top_fraction=0.0)
    bad = OfflineDataset(ds.episodes, gym.spaces.MultiBinary(3), ds.action_space)
    with pytest.raises(ValueError, match="supported"):
        TrajectoryBuffer(bad, context=2)


def test_batch_to_device_keeps_values():
    batch = TrajectoryBuffer(vector_dataset([5]), context=3).sample(4)
    moved = batch.to("cpu")
    assert torch.equal(moved.states, batch.states) and torch.equal(moved.mask, batch.mask)
