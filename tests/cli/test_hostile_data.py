"""Hostile dataset files, one test per way their values or sizes got past the readers: a NaN
or infinite reward or observation, an action the action space does not hold, and a size a
file declares but does not hold (which the readers used to allocate before any check).

Every refusal is exit code 2 with exactly one ``error:`` line naming the file and the bad
value, no traceback and no run folder; a lying size is refused within seconds and without
the memory it declares."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import tests.cli.test_trust as trust_tests
from rltrans.envs.dqn_replay import write_dqn_replay_shard
from rltrans.train import main as train_main
from tests.helpers.hostile import address_space_limit, peak_mb

DT_TINY = trust_tests.DT_TINY
dataset = trust_tests.dataset  # the fixture, shared by name

HDF5 = Path("data") / "main_data.hdf5"
SECONDS = 20  # a refusal reads headers only: far less than this even on a busy machine
GROWTH_MB = 200  # what a refusal may add to the peak resident set (not the declared GBs)


def one_error(capsys) -> str:
    """The one error line of a command refused with exit code 2 (no traceback, no other)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


def rewrite(folder: Path, name: str, edit) -> None:
    """Replace dataset ``name`` of a Minari HDF5 file by ``edit(its array)``."""
    with h5py.File(folder / HDF5, "a") as f:
        array = edit(f[name][()])
        del f[name]
        f[name] = array


def set_item(index, value, dtype=None):
    def edit(array):
        array = array.astype(dtype) if dtype else array.copy()
        array[index] = value
        return array

    return edit


def refused_dt(run: Path, capsys, *args: str) -> str:
    """Train DT on the dataset: refused with one error line, before a run folder exists."""
    assert train_main([*DT_TINY, f"run_dir={run}", *args]) == 2
    assert not run.exists(), "a refused run left its folder"
    return one_error(capsys)


# ----------------------------------------------------------------------------- Minari values

CASES = [  # (HDF5 dataset, index, value, cast to, the error's tail)
    ("episode_2/rewards", 1, np.nan, None, "rewards[1] is nan; rewards must be finite float32"),
    ("episode_0/rewards", 3, -np.inf, None, "rewards[3] is -inf; rewards must be finite"),
    ("episode_3/rewards", 0, 1e300, "f8", "rewards[0] is 1e+300; rewards must be finite float32"),
    ("episode_1/observations", (5, 2), np.inf, None, "observations[5, 2] is inf; observations"),
    ("episode_1/observations", (0, 0), np.nan, None, "observations[0, 0] is nan; observations"),
    ("episode_1/actions", 0, 7, None, "actions[0] is 7; Discrete(2) holds the whole numbers 0..1"),
    ("episode_2/actions", 4, -1, None, "actions[4] is -1; Discrete(2) holds the whole numbers"),
    ("episode_1/actions", 2, 0.5, "f8", "actions[2] is 0.5; Discrete(2) holds the whole numbers"),
    ("episode_0/actions", 1, 1.5, "f4", "actions[1] is 1.5; Discrete(2) holds the whole numbers"),
    (
        "episode_0/actions",
        1,
        np.nan,
        "f4",
        "actions[1] is nan; Discrete(2) holds the whole numbers",
    ),
]


@pytest.mark.parametrize(("name", "index", "value", "dtype", "tail"), CASES)
def test_a_bad_value_in_a_minari_episode_is_one_error_naming_it(
    name, index, value, dtype, tail, dataset, tmp_path, capsys
):
    rewrite(dataset, name, set_item(index, value, dtype))
    episode = name.split("/")[0]
    line = refused_dt(tmp_path / "run", capsys)
    assert line.startswith(f"error: dataset 'rltrans/cp-v0': {dataset / HDF5} {episode}: "), line
    assert tail in line, line


def test_whole_float_actions_for_a_discrete_space_still_load(dataset, tmp_path, capsys):
    rewrite(dataset, "episode_1/actions", lambda a: a.astype(np.float32))
    assert train_main([*DT_TINY, f"run_dir={tmp_path / 'run'}"]) == 0


@pytest.mark.filterwarnings("ignore:`eval_env` is set to None")
def test_box_actions_must_be_finite_and_may_overshoot_their_bounds(tmp_path, monkeypatch):
    import gymnasium as gym

    from rltrans.envs.minari_data import load_minari, write_minari
    from rltrans.envs.offline import DatasetError, Episode

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    actions = np.array([[0.5, 1.001], [-1.2, 0.0], [0.0, 0.0]], np.float32)  # two overshoot
    episode = Episode(np.zeros((3, 2)), actions, np.ones(3), True, False, np.zeros(2))
    spaces = {"observation_space": box, "action_space": box}
    meta = {"env": None, "algorithm_name": "x", "author": "x", "description": "x", **spaces}
    write_minari("rltrans/box-v0", [episode], **meta)
    assert load_minari("rltrans/box-v0", progress=False)[0].actions[1, 0] == np.float32(-1.2)
    episode.actions[2, 1] = np.inf
    write_minari("rltrans/boxinf-v0", [episode], **meta)
    with pytest.raises(DatasetError, match=r"episode_0: actions\[2, 1\] is inf"):
        load_minari("rltrans/boxinf-v0", progress=False)


# ----------------------------------------------------------------------------- Minari sizes


def edit_metadata(folder: Path, **changes) -> Path:
    path = folder / "data" / "metadata.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))
    return path


def bounded(run: Path, capsys, *args: str) -> str:
    """A refusal within :data:`SECONDS` and :data:`GROWTH_MB`, under an address-space cap
    (so a reader that still allocated what the file declares fails here, not the machine)."""
    start_mb, start = peak_mb(), time.perf_counter()
    with address_space_limit(1024):
        line = refused_dt(run, capsys, *args)
    assert time.perf_counter() - start < SECONDS
    assert peak_mb() - start_mb < GROWTH_MB
    return line


@pytest.mark.parametrize("count", [300_000_000, 10**9, 5, 0])
def test_a_minari_episode_count_the_file_does_not_hold_is_refused_at_once(
    count, dataset, tmp_path, capsys
):
    meta = edit_metadata(dataset, total_episodes=count)
    line = bounded(tmp_path / "run", capsys)
    expected = f"{meta}: total_episodes={count} but {dataset / HDF5} holds 4 episodes"
    assert line == f"error: dataset 'rltrans/cp-v0': {expected}"


@pytest.mark.parametrize("value", [-1, "20", 2.5, True, None])
def test_a_minari_episode_count_that_is_no_count_is_refused(value, dataset, tmp_path, capsys):
    meta = edit_metadata(dataset, total_episodes=value)
    line = refused_dt(tmp_path / "run", capsys)
    expected = f"{meta}: total_episodes={value!r}; expected a whole number >= 0"
    assert line == f"error: dataset 'rltrans/cp-v0': {expected}"


def test_an_hdf5_array_the_file_does_not_hold_is_refused_at_once(dataset, tmp_path, capsys):
    with h5py.File(dataset / HDF5, "a") as f:  # 4 GB declared, nothing stored (fill value)
        del f["episode_1/rewards"]
        f.create_dataset("episode_1/rewards", shape=(10**9,), dtype="f4", chunks=(2**16,))
    line = bounded(tmp_path / "run", capsys)
    assert f"{dataset / HDF5}: episode_1/rewards declares shape (1000000000,) (3.7 GiB)" in line
    assert "but the file stores 0 B of it" in line


def test_episode_arrays_that_disagree_on_their_length_are_named(dataset, tmp_path, capsys):
    rewrite(dataset, "episode_2/actions", lambda a: a[:-1])
    line = refused_dt(tmp_path / "run", capsys)
    assert f"{dataset / HDF5}: episode_2's arrays disagree on its length" in line


# ----------------------------------------------------------------------------- DQN Replay

DQN = ["algo.dqn_replay.check_size=false", "algo.eval_episodes=0", "dataset=pong-mixed-v0"]


def shard(root: Path, n: int = 120, **edits) -> dict[str, Path]:
    """A small DQN Replay checkpoint (Pong, run 1, epoch 1) with ``edits`` of its arrays."""
    rng = np.random.default_rng(0)
    arrays = {
        "observations": rng.integers(0, 255, (n, 84, 84), dtype=np.uint8),
        "actions": rng.integers(0, 6, n).astype(np.int32),
        "rewards": np.zeros(n, np.float32),
        "terminals": (np.arange(n) % 40 == 39).astype(np.uint8),
    }
    for key, (index, value) in edits.items():
        arrays[key][index] = value
    return write_dqn_replay_shard(root, "Pong", 1, 1, **arrays, compresslevel=1)


def refused_dqn(root: Path, tmp_path: Path, capsys, *args: str) -> str:
    line = refused_dt(tmp_path / "run", capsys, *DQN, f"algo.dqn_replay.root={root}", *args)
    assert line.startswith("error: dataset 'pong-mixed-v0': "), line
    return line.removeprefix("error: dataset 'pong-mixed-v0': ")


@pytest.mark.parametrize(
    ("edits", "field", "expected"),
    [
        ({"actions": (17, -3)}, "action",
         "actions[17] is -3; Discrete(18) holds the whole numbers 0..17"),
        ({"actions": (3, 18)}, "action",
         "actions[3] is 18; Discrete(18) holds the whole numbers 0..17"),
        ({"rewards": (30, np.nan)}, "reward",
         "reward[30] is nan; reward must be finite float32 numbers"),
        ({"rewards": (2, np.inf)}, "reward",
         "reward[2] is inf; reward must be finite float32 numbers"),
    ],
)  # fmt: skip
def test_a_bad_value_in_a_dqn_replay_file_is_one_error_naming_it(
    edits, field, expected, dataset, tmp_path, capsys
):
    paths = shard(tmp_path / "dqn", **edits)
    assert refused_dqn(tmp_path / "dqn", tmp_path, capsys) == f"{paths[field]}: {expected}"


def lying_header(path: Path, shape: tuple[int, ...], payload: int = 32_000) -> None:
    """Rewrite an observation file: a header declaring ``shape``, then ``payload`` bytes."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        header = {"descr": "|u1", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(f, header)
        f.write(np.random.default_rng(0).integers(0, 255, payload, np.uint8).tobytes())


@pytest.mark.parametrize(
    ("shape", "check_size", "expected"),
    [
        ((10**7, 84, 84), "false", "the header declares 10000000 rows; a DQN Replay checkpoint "
         "holds at most 1000000 (Dopamine's replay capacity)"),
        ((10**6, 84, 84), "true", "the header declares shape (1000000, 84, 84) (6.6 GiB) but "
         "the file is "),
        ((120, 84, 84 * 84), "false", "shape (120, 84, 7056), expected (N, 84, 84)"),
    ],
)  # fmt: skip
def test_a_dqn_replay_header_the_file_does_not_hold_is_refused_at_once(
    shape, check_size, expected, dataset, tmp_path, capsys
):
    paths = shard(tmp_path / "dqn")
    lying_header(paths["observation"], shape)
    start_mb, start = peak_mb(), time.perf_counter()
    with address_space_limit(1024):
        line = refused_dqn(
            tmp_path / "dqn", tmp_path, capsys, f"algo.dqn_replay.check_size={check_size}"
        )
    assert time.perf_counter() - start < SECONDS
    assert peak_mb() - start_mb < GROWTH_MB
    assert line.startswith(f"{paths['observation']}: {expected}"), line


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("kind", ["minari", "dqn_replay"])
def test_data_larger_than_this_machines_memory_is_refused_before_it_is_read(
    kind, dataset, tmp_path, capsys, monkeypatch
):
    import rltrans.envs.dataset_checks as checks

    monkeypatch.setattr(checks, "physical_memory", lambda: 2**10)  # a 1 KiB machine
    if kind == "minari":
        line = refused_dt(tmp_path / "run", capsys)
        where = f"dataset 'rltrans/cp-v0': {dataset / HDF5}"
    else:
        shard(tmp_path / "dqn")
        line = "error: dataset 'pong-mixed-v0': " + refused_dqn(tmp_path / "dqn", tmp_path, capsys)
        where = f"dataset 'pong-mixed-v0': {tmp_path / 'dqn' / 'Pong' / '1' / 'replay_logs'}"
    assert line.startswith(f"error: {where}: the files declare "), line
    assert line.endswith(
        "of arrays, more than this machine's 1.0 KiB of memory; load fewer epochs "
        "or use a larger machine"
    ), line
