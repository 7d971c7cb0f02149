"""Checkpoints: round trips, safe loading, corruption, crash atomicity, rotation, compatibility."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.run.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointManager,
    CheckpointVersionError,
    load_checkpoint,
    save_checkpoint,
)
from rltrans.run.rng import restore_rng_state, rng_state
from rltrans.spaces import (
    SpaceMismatchError,
    check_same_spaces,
    deserialize_space,
    serialize_space,
    space_to_dict,
)


class Custom:
    """A class that only full unpickling could rebuild."""

    def __init__(self) -> None:
        self.value = 3


def _assert_same(a: Any, b: Any, path: str = "") -> None:
    """Deep equality for nested containers of tensors and plain values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def _realistic_payload() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 100)
    model(torch.randn(5, 4)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "config": {
            "agent": {"d_model": 64, "gate": "gru", "gate_bias": 2.0, "layers": [1, 2]},
            "seed": None,
            "cuda": False,
            "shape": (4, 2),
        },
        "obs_norm": {"mean": torch.randn(4), "var": torch.rand(4), "count": torch.tensor(12.0)},
        "global_step": 12_345,
        "spaces": {"observation": space_to_dict(gym.spaces.Box(-1.0, 1.0, (4,)))},
    }


def test_round_trip_of_a_realistic_payload(tmp_path: Path) -> None:
    payload = _realistic_payload()
    save_checkpoint(tmp_path / "ckpt.pt", payload)
    loaded = load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded["format_version"] == FORMAT_VERSION
    assert isinstance(loaded["rltrans_version"], str)
    # The scheduler holds its lambda only as a reference; its state_dict is plain data.
    _assert_same(payload, {k: v for k, v in loaded.items() if k in payload})
    assert list(os.listdir(tmp_path)) == ["ckpt.pt"], "no temp file may be left behind"


def test_restored_state_dicts_resume_training(tmp_path: Path) -> None:
    payload = _realistic_payload()
    save_checkpoint(tmp_path / "ckpt.pt", payload)
    loaded = load_checkpoint(tmp_path / "ckpt.pt")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    model.load_state_dict(loaded["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    optimizer.load_state_dict(loaded["optimizer"])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(3e-4 * 0.99)
    assert int(optimizer.state[model[0].weight]["step"]) == 1


def test_rng_restore_reproduces_draws(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.standard_normal()
    save_checkpoint(tmp_path / "rng.pt", {"rng": rng_state()})

    def draw() -> tuple[list[float], np.ndarray, torch.Tensor]:
        python = [random.random(), random.gauss(0, 1)]
        return python, np.random.standard_normal(5), torch.rand(5)

    expected = draw()
    draw()  # move every generator on
    restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    actual = draw()
    assert actual[0] == expected[0]
    np.testing.assert_array_equal(actual[1], expected[1])
    assert torch.equal(actual[2], expected[2])


def test_truncated_files_raise_checkpoint_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "good.pt", _realistic_payload())
    data = (tmp_path / "good.pt").read_bytes()
    for length in (0, 1, 30, len(data) // 3, len(data) // 2, len(data) - 100, len(data) - 1):
        bad = tmp_path / f"cut_{length}.pt"
        bad.write_bytes(data[:length])
        with pytest.raises(CheckpointError, match=rf"cut_{length}\.pt.*corrupt"):
            load_checkpoint(bad)


def test_random_bytes_and_foreign_files_raise_checkpoint_error(tmp_path: Path) -> None:
    noise = tmp_path / "noise.pt"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(CheckpointError, match=r"noise\.pt.*corrupt"):
        load_checkpoint(noise)
    foreign = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, foreign)  # a torch file, but not ours
    with pytest.raises(CheckpointError, match="not an rltrans checkpoint"):
        load_checkpoint(foreign)


def test_pickled_custom_class_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "obj": Custom()}, path)
    with pytest.raises(CheckpointError, match=r"refusing to load .*evil\.pt.*Custom"):
        load_checkpoint(path)


def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.pt"
    torch.save({"format_version": FORMAT_VERSION + 1, "rltrans_version": "9.0"}, path)
    newer = FORMAT_VERSION + 1
    with pytest.raises(CheckpointVersionError, match=rf"format version {newer}.*Upgrade rltrans"):
        load_checkpoint(path)


def test_missing_file_lists_existing_checkpoints(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "step_1.pt", {"a": 1})
    with pytest.raises(FileNotFoundError, match=r"nope\.pt does not exist.*step_1\.pt"):
        load_checkpoint(tmp_path / "nope.pt")


@pytest.mark.parametrize(
    ("value", "path", "hint"),
    [
        (np.float32(1.0), r"\['config'\]\['lr'\]", "numpy.float32"),
        (np.zeros(3), r"\['config'\]\['lr'\]", r"torch\.from_numpy"),
        (Custom(), r"\['config'\]\['lr'\]", "Custom"),
        (Path("x"), r"\['config'\]\['lr'\]", r"str\(path\)"),
    ],
)
def test_save_time_validation_names_the_key_path(
    tmp_path: Path, value: Any, path: str, hint: str
) -> None:
    payload = {"model": {"w": torch.zeros(2)}, "config": {"lr": value}}
    with pytest.raises(TypeError, match=rf"{path}.*{hint}"):
        save_checkpoint(tmp_path / "bad.pt", payload)
    assert not list(tmp_path.iterdir()), "nothing may be written when validation fails"


def test_save_time_validation_reports_nested_lists_and_omegaconf(tmp_path: Path) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"lr": 1e-3})
    with pytest.raises(TypeError, match=r"\['config'\].*OmegaConf\.to_container"):
        save_checkpoint(tmp_path / "bad.pt", {"config": cfg})
    with pytest.raises(TypeError, match=r"\['history'\]\[1\]\['x'\].*int64"):
        save_checkpoint(tmp_path / "bad.pt", {"history": [{"x": 1}, {"x": np.int64(2)}]})
    ok = {"od": OrderedDict(a=torch.ones(1)), "s": {1, 2}, "d": torch.float16, "b": b"raw"}
    save_checkpoint(tmp_path / "ok.pt", ok)
    _assert_same(ok, {k: v for k, v in load_checkpoint(tmp_path / "ok.pt").items() if k in ok})


def test_manager_prunes_to_keep_last(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    assert manager.latest() is None and manager.load_latest() is None
    for step in (10, 20, 30, 40):
        manager.save(step, {"step": step})
    assert [s for s, _ in manager.checkpoints()] == [30, 40]
    assert sorted(os.listdir(tmp_path)) == [
        "last.pt",
        "step_000000000030.pt",
        "step_000000000040.pt",
    ]
    assert manager.latest() == tmp_path / "last.pt"
    assert manager.load_latest()["step"] == 40


def test_manager_falls_back_when_last_is_corrupt(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        manager.save(step, {"step": step, "w": torch.randn(100)})
    # last.pt is a hard link to step 3: damaging it in place damages both names.
    data = manager.last_path.read_bytes()
    with open(manager.last_path, "r+b") as f:
        f.truncate(len(data) // 2)
    assert manager.latest() == manager.step_path(2)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        assert manager.load_latest()["step"] == 2


def test_manager_saving_an_earlier_step_keeps_the_new_file(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(50, {"step": 50})
    with pytest.warns(UserWarning, match="later steps"):
        manager.save(20, {"step": 20})  # e.g. a resume from an older checkpoint
    assert manager.step_path(20).exists()
    assert manager.load_latest()["step"] == 20


def _writer_loop(directory: str, first_step: int) -> None:
    """Child process: write checkpoints as fast as possible until killed."""
    manager = CheckpointManager(directory, keep_last=2)
    step = first_step
    while True:
        manager.save(step, {"step": step, "data": torch.full((20_000,), float(step))})
        step += 1


def _check_complete(payload: dict[str, Any]) -> int:
    step = payload["step"]
    assert payload["data"].shape == (20_000,)
    assert bool((payload["data"] == step).all())
    return step


@pytest.mark.skipif(os.name != "posix" or "fork" not in mp.get_all_start_methods(), reason="fork")
def test_sigkill_during_saves_always_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")  # fork: no re-import of torch, so each round costs milliseconds
    rng = np.random.default_rng(0)
    manager = CheckpointManager(tmp_path, keep_last=2)
    next_step, latest_step = 0, -1
    for _ in range(6):
        process = ctx.Process(target=_writer_loop, args=(str(tmp_path), next_step))
        process.start()
        deadline = time.monotonic() + 10.0
        while manager.latest() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(float(rng.uniform(0.01, 0.15)))
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        assert process.exitcode == -signal.SIGKILL
        step = _check_complete(load_checkpoint(manager.latest()))
        assert step >= latest_step, "latest() must never go back to an older checkpoint"
        latest_step = step
        # Every visible (non-temp) file must be complete, not only the one latest() picked.
        for _, path in manager.checkpoints():
            _check_complete(load_checkpoint(path))
        next_step = max(s for s, _ in manager.checkpoints()) + 1
    # The next save by a live writer removes the temp files the killed writers left.
    manager.save(next_step, {"step": next_step, "data": torch.full((20_000,), 0.0)})
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_space_mismatch_message_names_both_spaces() -> None:
    actions = gym.spaces.Discrete(2)
    saved = (gym.spaces.Box(-1.0, 1.0, (4,)), actions)
    current = (gym.spaces.Box(-1.0, 1.0, (2,)), actions)
    check_same_spaces(saved, saved)  # equal spaces pass
    with pytest.raises(SpaceMismatchError) as info:
        check_same_spaces(saved, current, actual_label="the env has")
    message = str(info.value)
    assert "trained on observation space Box(-1.0, 1.0, (4,), float32)" in message
    assert "the env has Box(-1.0, 1.0, (2,), float32)" in message
    assert "shape" in message
    with pytest.raises(SpaceMismatchError, match="action space Discrete"):
        check_same_spaces(saved, (saved[0], gym.spaces.Discrete(3)))


def test_space_to_dict_describes_every_space_kind() -> None:
    low, high = np.array([0.0, -1.0], np.float32), np.array([1.0, 2.0], np.float32)
    space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
            "vector": gym.spaces.Box(low, high),
            "action_mask": gym.spaces.MultiBinary(4),
            "inventory": gym.spaces.MultiDiscrete([2, 3]),
            "pair": gym.spaces.Tuple([gym.spaces.Discrete(3, start=1), gym.spaces.Discrete(2)]),
        }
    )
    described = space_to_dict(space)
    assert described["spaces"]["image"] == {
        "type": "Box",
        "shape": [3, 8, 8],
        "dtype": "uint8",
        "low": 0,
        "high": 255,
    }
    assert described["spaces"]["vector"]["low"]["min"] == -1.0
    assert described["spaces"]["inventory"]["nvec"] == [2, 3]
    assert described["spaces"]["action_mask"] == {"type": "MultiBinary", "n": 4}
    assert described["spaces"]["pair"]["spaces"][0] == {"type": "Discrete", "n": 3, "start": 1}
    # Survives the stored form (exact JSON) and still compares equal.
    stored = deserialize_space(serialize_space(space))
    check_same_spaces((stored, space["pair"]), (space, space["pair"]))
    # Bounds that differ only inside the array (same min and max) are still told apart.
    other = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    act = gym.spaces.Discrete(2)
    with pytest.raises(SpaceMismatchError, match="low"):
        check_same_spaces((gym.spaces.Box(low, high), act), (other, act))
    with pytest.raises(SpaceMismatchError, match=r"Discrete\(3\).*Discrete\(2\).*n"):
        check_same_spaces((other, gym.spaces.Discrete(3)), (other, gym.spaces.Discrete(2)))
