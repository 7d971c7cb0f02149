"""DQN Replay reader on generated checkpoints in the real file format (gzip + np.save)."""

from __future__ import annotations

import gzip

import gymnasium as gym
import numpy as np
import pytest

from rltrans.envs.dqn_replay import (
    capitalize_game_name,
    d4rl_stack,
    dqn_replay_episodes,
    dqn_replay_to_minari,
    load_dqn_replay,
    parse_d4rl_atari_id,
    stack_frames,
    write_dqn_replay_shard,
)
from rltrans.envs.offline import DatasetError

PAD = 3  # Dopamine's zero rows before each episode


def make_checkpoint(lengths, tail, seed=0, lead_pad=True):
    """Rows as Dopamine logs them: [3 zero rows, episode] per episode, then an unterminated tail.

    Returns the four arrays and, per episode, the slice of its real rows.
    """
    rng = np.random.default_rng(seed)
    blocks, slices, row = [], [], 0
    for k, length in enumerate([*lengths, tail]):
        pad = PAD if (k > 0 or lead_pad) else 0
        obs = rng.integers(1, 256, (pad + length, 84, 84), dtype=np.uint8)
        obs[:pad] = 0
        act = rng.integers(0, 6, pad + length).astype(np.int32)
        act[:pad] = 0
        rew = rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), pad + length)
        rew[:pad] = 0
        term = np.zeros(pad + length, np.uint8)
        if k < len(lengths):
            term[-1] = 1
        blocks.append((obs, act, rew, term))
        slices.append(slice(row + pad, row + pad + length))
        row += pad + length
    arrays = [np.concatenate(parts) for parts in zip(*blocks, strict=True)]
    return arrays, slices


# 4 terminated episodes + an unterminated tail: 5 * 3 padding + 222 real = 237 rows
LENGTHS, TAIL = [40, 57, 30, 75], 20


@pytest.fixture
def checkpoint():
    return make_checkpoint(LENGTHS, TAIL)


def write(root, arrays, epoch=1, layout="raw", add_count=None, game="Pong", run=1):
    return write_dqn_replay_shard(
        root, game, run, epoch, *arrays, add_count=add_count, layout=layout, compresslevel=1
    )


# ---------------------------------------------------------------------------------- ids


@pytest.mark.parametrize(
    ("dataset_id", "expected"),
    [
        ("pong-mixed-v0", ("Pong", 1, [1])),
        ("breakout-medium-v4", ("Breakout", 5, [10])),
        ("ms-pacman-expert-v2", ("MsPacman", 3, [50])),
        ("up-n-down-epoch-7-v1", ("UpNDown", 2, [7])),
        ("montezuma-revenge-epoch-50-v3", ("MontezumaRevenge", 4, [50])),
        ("air-raid-epoch-1-v0", ("AirRaid", 1, [1])),
    ],
)
def test_parse_d4rl_atari_id(dataset_id, expected):
    assert parse_d4rl_atari_id(dataset_id) == expected


def test_capitalize_game_name():
    assert capitalize_game_name("ms-pacman") == "MsPacman"
    assert capitalize_game_name("up-n-down") == "UpNDown"
    assert capitalize_game_name("space_invaders") == "SpaceInvaders"


@pytest.mark.parametrize(
    ("dataset_id", "message"),
    [
        ("pong-hard-v0", "mixed, medium, expert or epoch-N"),
        ("pong-mixed-v5", "v0..v4"),
        ("pong-epoch-51-v0", "1..50"),
        ("pong-epoch-0-v0", "1..50"),
        ("Pong-mixed-v0", "lower-case"),
    ],
)
def test_parse_errors_list_valid_values(dataset_id, message):
    with pytest.raises(ValueError, match=message):
        parse_d4rl_atari_id(dataset_id)


# ------------------------------------------------------------------- d4rl-atari dict


@pytest.mark.parametrize("layout", ["raw", "d4rl"])
def test_load_matches_written_arrays(tmp_path, checkpoint, layout):
    arrays, _ = checkpoint
    paths = write(tmp_path, arrays, layout=layout)
    if layout == "raw":
        assert paths["observation"] == tmp_path / "Pong/1/replay_logs/$store$_observation_ckpt.1.gz"
    else:
        assert paths["observation"] == tmp_path / "Pong/1/1/observation.gz"
    data = load_dqn_replay("pong-mixed-v0", root=tmp_path, check_size=False, progress=False)
    assert set(data) == {"observations", "actions", "rewards", "terminals"}
    n = len(arrays[0])
    assert data["observations"].shape == (n, 1, 84, 84)
    dtypes = [data[k].dtype for k in ("observations", "actions", "rewards", "terminals")]
    assert dtypes == [np.uint8, np.int32, np.float32, np.uint8]
    for key, want in zip(("observations", "actions", "rewards", "terminals"), arrays, strict=True):
        np.testing.assert_array_equal(data[key].reshape(want.shape), want)


def test_root_from_environment_variable(tmp_path, monkeypatch, checkpoint):
    write(tmp_path, checkpoint[0], layout="d4rl")
    monkeypatch.setenv("D4RL_DATASET_DIR", str(tmp_path))
    data = load_dqn_replay("pong-mixed-v0", check_size=False, progress=False)
    np.testing.assert_array_equal(data["actions"], checkpoint[0][1])


def test_epochs_are_concatenated_in_the_given_order(tmp_path):
    (a, _), (b, _) = make_checkpoint([10], 5, seed=1), make_checkpoint([12], 4, seed=2)
    write(tmp_path, a, epoch=3)
    write(tmp_path, b, epoch=4, layout="d4rl")  # layouts may differ per checkpoint
    data = load_dqn_replay(
        "pong", run=1, epochs=[4, 3], root=tmp_path, check_size=False, progress=False
    )
    for k, key in enumerate(("observations", "actions", "rewards", "terminals")):
        want = np.concatenate([b[k], a[k]])
        np.testing.assert_array_equal(data[key].reshape(want.shape), want)


def naive_stack(obs, terminals, i, k=4):
    """Row i's stack: frames back to (not past) the previous terminal, zero-filled in front."""
    frames = []
    j = i
    while j >= 0 and len(frames) < k and (j == i or not terminals[j]):
        frames.insert(0, obs[j])
        j -= 1
    zeros = [np.zeros_like(obs[0])] * (k - len(frames))
    return np.stack(zeros + frames)


def test_stack_equals_naive_rule_on_every_row(tmp_path, checkpoint):
    arrays, _ = checkpoint
    write(tmp_path, arrays)
    data = load_dqn_replay("pong-mixed-v0", root=tmp_path, stack=True, check_size=False)
    obs, terminals = arrays[0], arrays[3]
    stacks = data["observations"]
    assert isinstance(stacks, list) and len(stacks) == len(obs)
    for i, s in enumerate(stacks):
        assert s.shape == (4, 84, 84) and s.dtype == np.uint8
        np.testing.assert_array_equal(s, naive_stack(obs, terminals, i))


def test_stack_shares_memory_exactly_where_the_rule_takes_a_slice(checkpoint):
    obs, _, _, terminals = checkpoint[0]
    stacks = d4rl_stack(obs, terminals)
    t = 1
    for i, s in enumerate(stacks):
        assert np.shares_memory(s, obs) == (t >= 4)
        t = 1 if terminals[i] else t + 1
    assert sum(np.shares_memory(s, obs) for s in stacks) > len(obs) // 2


def test_missing_files_list_both_layouts(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_dqn_replay("ms-pacman-expert-v1", root=tmp_path)
    text = str(info.value)
    for name in ("observation", "action", "reward", "terminal"):
        assert str(tmp_path / f"MsPacman/2/replay_logs/$store$_{name}_ckpt.50.gz") in text
        assert str(tmp_path / f"MsPacman/2/50/{name}.gz") in text
    assert "gsutil" in text and "gs://atari-replay-datasets/dqn" in text


def test_dtype_and_size_are_checked(tmp_path, checkpoint):
    arrays, _ = checkpoint
    paths = write(tmp_path, arrays)
    with pytest.raises(ValueError, match="check_size=False"):
        load_dqn_replay("pong-mixed-v0", root=tmp_path, progress=False)
    with gzip.open(paths["action"], "wb") as f:
        np.save(f, arrays[1].astype(np.int64))
    with pytest.raises(ValueError, match=r"action_ckpt\.1\.gz: dtype int64, expected int32"):
        load_dqn_replay("pong-mixed-v0", root=tmp_path, check_size=False, progress=False)


def test_writer_refuses_unsafe_dtypes(tmp_path, checkpoint):
    obs, act, rew, term = checkpoint[0]
    with pytest.raises(ValueError, match="float64"):
        write(tmp_path, [obs.astype(np.float64), act, rew, term])


# -------------------------------------------------------------------------- episodes


def load_eps(root, **kwargs):
    kwargs = {"check_size": False, "progress": False, **kwargs}
    return dqn_replay_episodes("pong-mixed-v0", root=root, **kwargs)


def test_episodes_drop_padding_and_truncate_the_tail(tmp_path, checkpoint):
    arrays, slices = checkpoint
    write(tmp_path, arrays)
    ds = load_eps(tmp_path)
    assert ds.lengths().tolist() == [*LENGTHS, TAIL]
    for ep, sl in zip(ds, slices, strict=True):
        np.testing.assert_array_equal(ep.observations, arrays[0][sl])
        np.testing.assert_array_equal(ep.actions, arrays[1][sl])
        np.testing.assert_array_equal(ep.rewards, arrays[2][sl])
        assert ep.observations.shape[1:] == (84, 84) and ep.observations.dtype == np.uint8
    assert [e.terminated for e in ds] == [True] * 4 + [False]
    assert [e.truncated for e in ds] == [False] * 4 + [True]
    np.testing.assert_allclose(ds.returns(), [arrays[2][sl].sum() for sl in slices])
    assert ds.info["headless_episodes"] == []
    # Stacks built at sampling time equal d4rl-atari's stacks of the same rows.
    d4rl = load_dqn_replay("pong-mixed-v0", root=tmp_path, stack=True, check_size=False)
    for ep, sl in zip(ds, slices, strict=True):
        for t in range(len(ep)):
            np.testing.assert_array_equal(
                stack_frames(ep.observations, t), d4rl["observations"][sl.start + t]
            )


def test_padding_keep_and_partial_drop(tmp_path):
    arrays, _ = make_checkpoint(LENGTHS, TAIL, lead_pad=False)  # starts mid-episode
    write(tmp_path, arrays)
    ds = load_eps(tmp_path)
    assert ds.info["headless_episodes"] == [0]
    assert load_eps(tmp_path, padding="keep").lengths().tolist() == [40, 60, 33, 78, 23]
    assert load_eps(tmp_path, partial="drop").lengths().tolist() == LENGTHS[1:]
    with pytest.raises(ValueError, match=r"padding='none'; valid: \['drop', 'keep'\]"):
        load_eps(tmp_path, padding="none")


def test_time_limit_episodes_are_truncated(tmp_path, checkpoint):
    write(tmp_path, checkpoint[0])
    ds = load_eps(tmp_path, max_episode_steps=57)
    assert [(e.terminated, e.truncated) for e in ds][:3] == [
        (True, False),
        (False, True),
        (True, False),
    ]


def test_chronological_order_from_add_count(tmp_path, checkpoint):
    arrays, _ = checkpoint
    n = len(arrays[0])
    shift = 57  # storage row of the oldest; chronological row n - 57 = 180 (episode 3) wraps
    stored = [np.roll(a, shift, axis=0) for a in arrays]  # np.roll(stored, -shift) == chronological
    write(tmp_path, stored, add_count=7 * n + shift)
    write(tmp_path / "plain", arrays)
    want = load_eps(tmp_path / "plain")
    got = load_eps(tmp_path, order="chronological")
    assert got.lengths().tolist() == want.lengths().tolist()
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
        assert (a.terminated, a.truncated) == (b.terminated, b.truncated)
    # Episodes are slices of the one loaded array, except the one copied across the wrap.
    base = got[0].observations.base
    assert base is not None
    assert [e.observations.base is base for e in got] == [True, True, True, False, True]
    # Index order cuts the data at the wrap instead: a different split.
    assert load_eps(tmp_path).lengths().tolist() != want.lengths().tolist()
    # Without the add_count file the reorder refuses rather than guessing.
    write(tmp_path / "no_count", stored)
    with pytest.raises(FileNotFoundError, match=r"add_count_ckpt\.1\.gz"):
        load_eps(tmp_path / "no_count", order="chronological")


def test_spaces_and_eval_env(tmp_path, checkpoint):
    write(tmp_path, checkpoint[0])
    ds = load_eps(tmp_path)
    assert ds.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    assert ds.action_space == gym.spaces.Discrete(int(checkpoint[0][1].max()) + 1)
    assert ds.frame_stack == 4
    assert ds.env_id == "ALE/Pong-v5" and ds.env_kwargs["repeat_action_probability"] == 0.0
    assert load_eps(tmp_path, num_actions=18).action_space == gym.spaces.Discrete(18)
    with pytest.raises(ValueError, match="num_actions=3"):
        load_eps(tmp_path, num_actions=3)


def test_eval_env_produces_zero_padded_stacks(tmp_path, checkpoint):
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    write(tmp_path, checkpoint[0], game="UpNDown")
    ds = dqn_replay_episodes("up-n-down-mixed-v0", root=tmp_path, check_size=False, progress=False)
    env = gym.make(ds.env_spec)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:3].any() and obs[3].any()  # like stack_frames at t=0
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    env.close()


def test_stack_frames_index_array_matches_int_index(checkpoint):
    frames = checkpoint[0][0][3:43]
    idx = np.array([0, 1, 2, 3, 17, 39])
    batch = stack_frames(frames, idx)
    assert batch.shape == (6, 4, 84, 84)
    for row, i in zip(batch, idx, strict=True):
        np.testing.assert_array_equal(row, stack_frames(frames, int(i)))
    assert np.shares_memory(stack_frames(frames, 3), frames)
    with pytest.raises(IndexError):
        stack_frames(frames, 40)


def test_convert_to_minari_round_trip(tmp_path, monkeypatch):
    from rltrans.envs.minari_data import load_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    arrays, _ = make_checkpoint([12, 9], 5)
    write(tmp_path, arrays)
    ds = load_eps(tmp_path)
    dqn_replay_to_minari(ds, "rltrans/pong-mixed-v0", author="rltrans tests")
    back = load_minari("rltrans/pong-mixed-v0", progress=False)
    assert back.env_id == "ALE/Pong-v5" and back.frame_stack == 4
    assert back.observation_space == ds.observation_space
    for a, b in zip(back, ds, strict=True):
        np.testing.assert_array_equal(a.observations, b.observations)  # lossless, no JPEG
        np.testing.assert_array_equal(a.final_observation, b.observations[-1])
        np.testing.assert_array_equal(a.actions, b.actions)
        assert (a.terminated, a.truncated) == (b.terminated, b.truncated)


# ---------------------------------------------------------------------------------- hostile files


def test_actions_outside_the_action_set_are_refused_by_both_readers(tmp_path, checkpoint):
    arrays, slices = checkpoint
    arrays[1][slices[1].start + 2] = -3  # a real row of the second episode
    paths = write(tmp_path, arrays)
    row = slices[1].start + 2
    message = rf"action_ckpt\.1\.gz: actions\[{row}\] is -3; Discrete\(18\) holds .* 0\.\.17"
    with pytest.raises(DatasetError, match=message):
        load_eps(tmp_path)
    with pytest.raises(DatasetError, match=message):
        load_dqn_replay("pong-mixed-v0", root=tmp_path, check_size=False, progress=False)
    assert paths["action"].is_file()


@pytest.mark.parametrize("value", [0, 19, -1, 2.5, "6"])
def test_num_actions_must_be_an_ale_action_count(tmp_path, checkpoint, value):
    write(tmp_path, checkpoint[0])
    with pytest.raises(ValueError, match=rf"num_actions={value!r}; valid: an integer in 1\.\.18"):
        load_eps(tmp_path, num_actions=value)


def test_an_add_count_that_is_no_count_is_refused_before_it_is_read(tmp_path, checkpoint):
    paths = write(tmp_path, checkpoint[0], add_count=5)
    with gzip.open(paths["add_count"], "wb") as f:  # a header declaring 8 GB, no data
        header = {"descr": "<i8", "fortran_order": False, "shape": (10**9,)}
        np.lib.format.write_array_header_1_0(f, header)
    with pytest.raises(DatasetError, match=r"int64\(1000000000,\), expected one integer"):
        load_eps(tmp_path, order="chronological")


def test_headers_are_checked_before_any_file_is_decompressed(tmp_path, checkpoint, monkeypatch):
    paths = write(tmp_path, checkpoint[0])
    with gzip.open(paths["terminal"], "wb") as f:  # the last file read lies about its rows
        header = {"descr": "|u1", "fortran_order": False, "shape": (10**7,)}
        np.lib.format.write_array_header_1_0(f, header)
    loads = []
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(a))
    with pytest.raises(DatasetError, match="declares 10000000 rows; .* at most 1000000"):
        load_eps(tmp_path)
    assert not loads, "an array was read before every header was checked"


def test_a_payload_shorter_than_its_header_names_the_file(tmp_path, checkpoint):
    paths = write(tmp_path, checkpoint[0])
    raw = gzip.decompress(paths["reward"].read_bytes())
    paths["reward"].write_bytes(gzip.compress(raw[:-40]))  # ten rewards short
    with pytest.raises(DatasetError, match=r"reward_ckpt\.1\.gz: EOF: reading array data"):
        load_eps(tmp_path)


def test_dopamine_rows_round_trip_through_the_reader(tmp_path):
    from rltrans.envs.dqn_replay import dopamine_rows

    rng = np.random.default_rng(0)
    played = [
        (
            rng.integers(1, 256, (t, 84, 84), dtype=np.uint8),
            rng.integers(0, 4, t),
            rng.choice(np.array([0.0, 1.0, 4.0, 7.0]), t),  # Breakout pays 1, 4 and 7 a brick
        )
        for t in (5, 1, 9)
    ]
    rows = dopamine_rows(played)
    assert len(rows[0]) == sum(3 + len(f) for f, _, _ in played)
    assert not rows[0][:3].any() and rows[3].sum() == len(played)
    write_dqn_replay_shard(tmp_path, "Breakout", 1, 1, *rows, layout="d4rl")
    data = dqn_replay_episodes("breakout-mixed-v0", root=tmp_path, check_size=False, progress=False)
    assert len(data.episodes) == len(played)
    for ep, (frames, actions, rewards) in zip(data.episodes, played, strict=True):
        np.testing.assert_array_equal(ep.observations, frames)
        np.testing.assert_array_equal(ep.actions, actions)
        np.testing.assert_array_equal(ep.rewards, np.clip(rewards, -1, 1))  # stored clipped
        assert ep.terminated and not ep.truncated
    with pytest.raises(ValueError, match=r"episode 0: frames \(2, 84\)"):
        dopamine_rows([(np.zeros((2, 84), np.uint8), np.zeros(2), np.zeros(2))])
