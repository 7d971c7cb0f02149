"""Run-folder writes never leave the folder, and no special file hangs a command.

Each test reproduces a way a hostile folder used to redirect rltrans's writes (a link where a
folder or file is expected, swapped in before or during a run; a user's own folder taken as a
run folder) or to block a command forever (a FIFO where a checkpoint, config or event file is
expected). Commands run in a subprocess or under an alarm, so a regression fails instead of
hanging the suite."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rltrans.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint_file,
)

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def no_hang(seconds: int = 30) -> Iterator[None]:
    """Fail the test (instead of hanging it) when the block takes longer than ``seconds``."""

    def expired(*_):
        raise TimeoutError(f"blocked for {seconds} s (a FIFO opened for a blocking read?)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(module: str, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    """``python -m rltrans.<module> args`` in a subprocess that may not hang."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLTRANS_NO_PROGRESS": "1"}
    try:
        return subprocess.run(
            [sys.executable, "-m", f"rltrans.{module}", *args],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"rltrans.{module} {' '.join(args)} hung for {timeout} s")


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The one error line of a command refused with exit code 2 (no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


def payload() -> dict:
    return {"model": {"w": torch.ones(3)}, "global_step": 1}


# ----------------------------------------------------------------------------- checkpoints


def test_a_fifo_in_a_checkpoints_place_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "checkpoints"
    manager = CheckpointManager(folder)
    good = manager.save(1, payload())
    os.unlink(manager.last_path)
    os.mkfifo(manager.last_path)
    os.mkfifo(folder / "step_000000000009.pt")
    with no_hang():
        for fifo in (manager.last_path, folder / "step_000000000009.pt"):
            with pytest.raises(CheckpointError, match="FIFO"):
                load_checkpoint(fifo)
            with pytest.raises(CheckpointError, match="FIFO"):
                verify_checkpoint_file(fifo)
        assert manager.latest() == good  # the FIFOs are skipped, the intact file found
        with pytest.warns(UserWarning, match="FIFO"):
            assert manager.load_latest()["global_step"] == 1


def test_a_deflated_checkpoint_is_refused_before_it_is_loaded(tmp_path):
    """torch.save stores members uncompressed; a compressed member (a small file that would
    expand to gigabytes in memory) is refused from the archive's directory alone."""
    real = tmp_path / "real.pt"
    save_checkpoint(real, payload())
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        prefix = src.namelist()[0].split("/")[0]
        dst.writestr(f"{prefix}/data/99", bytes(64 << 20))  # 64 MiB of zeros, ~64 KiB packed
    assert bomb.stat().st_size < 1 << 20
    for check in (load_checkpoint, verify_checkpoint_file):
        with pytest.raises(CheckpointError, match="compressed"):
            check(bomb)


def test_member_sizes_beyond_the_file_are_refused(tmp_path):
    real = tmp_path / "real.pt"
    save_checkpoint(real, payload())
    lying = tmp_path / "lying.pt"
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(lying, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
    data = bytearray(lying.read_bytes())
    # Claim a huge uncompressed size for the first member in the central directory.
    central = data.rfind(b"PK\x01\x02", 0, data.rfind(b"PK\x05\x06"))
    first = data.find(b"PK\x01\x02")
    assert 0 <= first <= central
    data[first + 24 : first + 28] = (1 << 31).to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="claim"):
        load_checkpoint(lying)


@pytest.mark.parametrize("with_parent_fd", [False, True])
def test_a_checkpoints_folder_swapped_for_a_link_between_saves_is_refused(tmp_path, with_parent_fd):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        manager = CheckpointManager(run / "checkpoints", parent_fd=fd if with_parent_fd else None)
        manager.save(1, payload())
        os.rename(run / "checkpoints", tmp_path / "moved")
        (run / "checkpoints").symlink_to(victim)
        with pytest.raises(CheckpointError, match="link"):
            manager.save(2, payload())
    finally:
        os.close(fd)
    assert list(victim.iterdir()) == []


def test_a_link_where_a_checkpoint_file_goes_is_replaced_or_refused_never_written_through(
    tmp_path,
):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "step_000000000001.pt").symlink_to(victim)
    (folder / "last.pt").symlink_to(victim)
    with pytest.raises(CheckpointError, match="link"):
        CheckpointManager(folder).save(1, payload())
    os.unlink(folder / "step_000000000001.pt")
    CheckpointManager(folder).save(1, payload())  # last.pt, its own pointer, is replaced
    assert not (folder / "last.pt").is_symlink()
    assert victim.read_text() == "keep"
