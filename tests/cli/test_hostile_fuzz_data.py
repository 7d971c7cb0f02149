"""Fuzzing the values and sizes inside offline datasets, beyond their metadata fields (which
tests/cli/test_hostile_fuzz.py draws): NaN, infinite and float32-overflowing rewards and
observations, actions outside the action space or between its whole numbers, episode arrays
that disagree on their length, lying episode counts, HDF5 arrays and .npy headers that
declare more than their file holds, in a Minari dataset and a DQN Replay checkpoint.

Each generated dataset must either train (exit 0) or be refused with exit code 2 and one
``error:`` line naming its file; an edit that makes the data invalid must be refused. No
exception may escape, no example may run past :data:`EXAMPLE_SECONDS`, the peak resident
set may not grow by :data:`PEAK_GROWTH_MB` (and an address-space cap turns an allocation a
file only declares into a failure, not a machine out of memory), and a refused run leaves no
folder."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rltrans.collect import main as collect_main
from rltrans.envs.dqn_replay import write_dqn_replay_shard
from rltrans.train import main as train_main
from tests.helpers.hostile import (
    FUZZ,
    PEAK_GROWTH_MB,
    address_space_limit,
    peak_mb,
    time_limit,
)

EPISODES = 4
F32_MAX = float(np.finfo(np.float32).max)
# Numbers a dataset may hold, the hostile ones in front.
NUMBERS = st.sampled_from(
    [math.nan, math.inf, -math.inf, 0.5, 1.5, -1.0, 2.0, 7.0, 1e300, 3e38, -0.0, 0.0, 1.0]
) | st.floats(allow_nan=True, allow_infinity=True, width=64)
INTEGERS = st.sampled_from([-3, -1, 0, 1, 2, 7, 17, 18, 2**31 - 1, -(2**31)])
COUNTS = st.sampled_from([0, 1, 3, 5, 2**31, 300_000_000, 10**9, 2**63, -1]) | st.integers(
    0, 10**12
)
ROWS = st.sampled_from([0, 1, 10**3, 10**6, 10**7, 10**9, 2**40])
MINARI_DT = [
    "agent=dt", "dataset=rltrans/fz-v0", "train_steps=2", "agent.dim=16", "agent.layers=1",
    "agent.context=4", "algo.batch_size=4", "algo.eval_episodes=1", "algo.eval_num_targets=1",
    "algo.eval_max_steps=100", "progress=false", "tensorboard=false", "compile=false",
    "torch_threads=1",
]  # fmt: skip
DQN_DT = [
    *[a for a in MINARI_DT if not a.startswith(("dataset=", "algo.eval_"))],
    "dataset=pong-mixed-v0", "algo.eval_episodes=0", "algo.dqn_replay.check_size=false",
]  # fmt: skip


def check_refusal(code: int, err: str, must_refuse: bool, names: tuple[str, ...]) -> None:
    """Trained, or refused with one error line; invalid data refused, naming one of the
    dataset's files (``names``). Never anything else."""
    assert "Traceback" not in err, err
    assert code in (0, 2), err
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, err
    if must_refuse:
        assert code == 2, f"invalid data was accepted: {err}"
        assert any(name in errors[0] for name in names), errors[0]


# ----------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 4-episode CartPole Minari dataset and a small DQN Replay checkpoint, made here."""
    root = tmp_path_factory.mktemp("hostile-data")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root / "minari"))
    collect = [
        "dataset_id=rltrans/fz-v0", "env_id=CartPole-v1", f"episodes={EPISODES}",
        "policy=rltrans.envs.scripted:CartPoleController", "max_episode_steps=20",
        "progress=false",
    ]  # fmt: skip
    assert collect_main(collect) == 0
    data = root / "minari" / "rltrans" / "fz-v0" / "data"
    originals = {p.name: p.read_bytes() for p in data.iterdir()}
    yield {"root": root, "data": data, "originals": originals}
    mp.undo()


# ----------------------------------------------------------------------------- Minari


@st.composite
def minari_edits(draw) -> list[tuple]:
    """1-3 edits of the Minari dataset: a value in an episode's arrays, an array cut short,
    a lying count in the metadata, or an array declaring more rows than the file holds."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["value", "value", "value", "cut", "count", "declared", "space"]
        kind = draw(st.sampled_from(kinds))
        episode = draw(st.integers(0, EPISODES - 1))
        field = draw(st.sampled_from(["rewards", "observations", "actions"]))
        if kind == "value":
            value = draw(NUMBERS | INTEGERS)
            edits.append(("value", episode, field, draw(st.integers(0, 10**6)), value))
        elif kind == "cut":
            edits.append(("cut", episode, field, draw(st.integers(1, 3))))
        elif kind == "space":  # a Box's width, Discrete's n
            box = draw(st.sampled_from([1, 3, 4, 5, 10**5]))
            edits.append(("space", box, draw(st.sampled_from([1, 2, 3, 2**31, 2**62]))))
        elif kind == "count":
            key = draw(st.sampled_from(["total_episodes", "total_steps"]))
            edits.append(("count", key, draw(COUNTS)))
        else:
            edits.append(("declared", episode, field, draw(ROWS)))
    return edits


def apply_minari(data: Path, edits: list[tuple]) -> bool:
    """Make ``edits``; whether they made the dataset invalid (it must then be refused)."""
    invalid, declared = False, set()  # arrays that declare rows they do not store
    spaces = (4, 2)  # CartPole's: a Box of 4, Discrete(2)
    meta_path = data / "metadata.json"
    meta = json.loads(meta_path.read_text())
    with h5py.File(data / "main_data.hdf5", "a") as f:
        for edit in edits:
            if edit[0] == "count":
                meta[edit[1]] = edit[2]
                continue
            if edit[0] == "space":
                bounds = {"low": [-1e9] * edit[1], "high": [1e9] * edit[1]}
                box = {"type": "Box", "dtype": "float32", "shape": [edit[1]], **bounds}
                meta["observation_space"] = json.dumps(box)
                discrete = {"type": "Discrete", "dtype": "int64", "start": 0, "n": edit[2]}
                meta["action_space"] = json.dumps(discrete)
                spaces = (edit[1], edit[2])
                continue
            name = f"episode_{edit[1]}/{edit[2]}"
            if name in declared:  # reading it here would allocate what it declares
                continue
            array = f[name][()]
            del f[name]
            if edit[0] == "value":
                index, value = edit[3] % array.shape[0], edit[4]
                array = array.astype(np.float64) if isinstance(value, float) else array
                array[index] = value  # a whole row of an observation
                f[name] = array
            elif edit[0] == "cut":
                f[name] = array[: max(0, len(array) - edit[3])]
                invalid = True
            else:  # the rows it declares, none of them stored (HDF5's fill value)
                shape = (edit[3], *array.shape[1:])
                f.create_dataset(name, shape=shape, dtype=array.dtype, chunks=True)
                declared.add(name)
                invalid |= edit[3] != len(array)
        # what the file holds now (a later edit may have undone an earlier one)
        for name in {f"episode_{e[1]}/{e[2]}" for e in edits if e[0] == "value"} - declared:
            values = f[name][()].astype(np.float64)
            if name.endswith("actions"):
                invalid |= not np.isin(values, np.arange(min(spaces[1], 3))).all()
            else:
                invalid |= not (np.abs(values) <= F32_MAX).all()
    meta_path.write_text(json.dumps(meta))
    invalid |= spaces[0] != 4 or spaces[1] < 2  # observations of 4; actions 0 and 1
    return invalid or meta["total_episodes"] != EPISODES


def test_every_minari_dataset_value_trains_or_is_refused(world, capsys):
    data, start = world["data"], peak_mb()

    @FUZZ
    @given(minari_edits())
    def check(edits):
        for name, content in world["originals"].items():
            (data / name).write_bytes(content)
        must_refuse = apply_minari(data, edits)
        run = world["root"] / "run"
        shutil.rmtree(run, ignore_errors=True)
        with time_limit(), address_space_limit(2048):
            code = train_main([*MINARI_DT, f"run_dir={run}"])
        names = (str(data / "main_data.hdf5"), str(data / "metadata.json"))
        check_refusal(code, capsys.readouterr().err, must_refuse, names)
        if code == 2:
            assert not run.exists(), "a refused run left its folder"

    try:
        check()
    finally:
        for name, content in world["originals"].items():
            (data / name).write_bytes(content)
    assert peak_mb() - start < PEAK_GROWTH_MB


# ----------------------------------------------------------------------------- DQN Replay

DQN_ROWS = 120
DQN_FILES = ("observation", "action", "reward", "terminal")


@st.composite
def dqn_edits(draw) -> list[tuple]:
    """1-3 edits of a DQN Replay checkpoint: an action or reward value, or a file whose
    .npy header declares other rows (its payload a few bytes or none)."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["action", "reward", "header"]))
        row = draw(st.integers(0, DQN_ROWS - 1))
        if kind == "action":
            edits.append(("action", row, draw(INTEGERS)))
        elif kind == "reward":
            edits.append(("reward", row, draw(NUMBERS)))
        else:
            rows = draw(ROWS | st.sampled_from([DQN_ROWS - 1, DQN_ROWS + 1]))
            payload = draw(st.sampled_from([0, 100, 32_000]))
            edits.append(("header", draw(st.sampled_from(DQN_FILES)), rows, payload))
    return edits


def write_dqn(root: Path, edits: list[tuple]) -> bool:
    """A fresh checkpoint under ``root`` with ``edits``; whether it is invalid."""
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, (DQN_ROWS, 84, 84), dtype=np.uint8)
    actions = rng.integers(0, 6, DQN_ROWS).astype(np.int32)
    rewards = np.zeros(DQN_ROWS, np.float32)
    terminals = (np.arange(DQN_ROWS) % 40 == 39).astype(np.uint8)
    headers = []
    for edit in edits:
        if edit[0] == "action":
            actions[edit[1]] = edit[2]
        elif edit[0] == "reward":
            with np.errstate(over="ignore"):  # 1e300 is inf in float32, as a file holds it
                rewards[edit[1]] = np.float32(edit[2])
        else:
            headers.append(edit)
    invalid = bool(headers) or not (actions.min() >= 0 and actions.max() < 18)
    invalid |= not np.isfinite(rewards).all()
    arrays = (obs, actions, rewards, terminals)
    paths = write_dqn_replay_shard(root, "Pong", 1, 1, *arrays, compresslevel=1)
    dtypes = {"observation": "|u1", "action": "<i4", "reward": "<f4", "terminal": "|u1"}
    for _, name, rows, payload in headers:
        shape = (rows, 84, 84) if name == "observation" else (rows,)
        with gzip.open(paths[name], "wb", compresslevel=1) as f:
            header = {"descr": dtypes[name], "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(f, header)
            f.write(bytes(payload))  # rows other than the other files' (or its payload's)
    return invalid


def test_every_dqn_replay_value_and_header_trains_or_is_refused(world, capsys):
    root, start = world["root"] / "dqn", peak_mb()

    @FUZZ
    @given(dqn_edits())
    def check(edits):
        must_refuse = write_dqn(root, edits)
        run = world["root"] / "dqn-run"
        shutil.rmtree(run, ignore_errors=True)
        with time_limit(), address_space_limit(2048):
            code = train_main([*DQN_DT, f"algo.dqn_replay.root={root}", f"run_dir={run}"])
        check_refusal(code, capsys.readouterr().err, must_refuse, (str(root),))
        if code == 2:
            assert not run.exists(), "a refused run left its folder"

    check()
    assert peak_mb() - start < PEAK_GROWTH_MB
