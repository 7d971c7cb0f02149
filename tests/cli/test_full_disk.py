"""A write the file system refuses (a full disk, a read-only folder) is one ``error:`` line
and exit code 2, never a traceback: what failed, what stayed intact, and how to go on.

A full disk is reproduced in-process by handing rltrans ``/dev/full`` (every write to it fails
with ENOSPC, from the kernel) where it creates a file, and, where this process may mount one,
by a real 1 MiB tmpfs. A read-only folder is a read-only mount for root (who ignores
permission bits) and a folder without write permission for anyone else."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rltrans import fsutil
from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO

# Four updates of 64 steps, a checkpoint after each: step_64, _128, _192, _256.
RUN = [*TINY_PPO, "total_steps=256", "checkpoint_every=1", "torch_threads=1", "compile=false"]
FULL = "No space left on device"
needs_dev_full = pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="no /dev/full on this system (Linux has one)"
)


def one_error_line(capsys) -> str:
    """The one ``error:`` line a refused command ended with on stderr (notes of the run may
    come before it; no traceback, no thread's exception)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors and errors == lines[-1:], err
    assert "Traceback" not in err and "Exception" not in err, err
    return errors[0]


def full_disk_for(monkeypatch, *targets: str) -> None:
    """Make the file rltrans creates for each of ``targets`` (a checkpoint's or config's
    temporary file) a descriptor of /dev/full: its first write fails with ENOSPC."""
    create_new = fsutil.create_new

    def full(name: str, *, dir_fd: int | None, mode: int = 0o644) -> int:
        if any(name.startswith(f".{target}.") for target in targets):
            return os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
        return create_new(name, dir_fd=dir_fd, mode=mode)

    monkeypatch.setattr(fsutil, "create_new", full)


@needs_dev_full
def test_a_full_disk_at_a_periodic_checkpoint_stops_with_one_line_and_the_last_one_intact(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    full_disk_for(monkeypatch, "step_000000000192.pt")
    assert train_main([*RUN, f"run_dir={run}"]) == 2
    err = one_error_line(capsys)
    assert f"cannot write checkpoint {run}/checkpoints/step_000000000192.pt: {FULL}" in err
    assert f"newest complete checkpoint is {run}/checkpoints/step_000000000128.pt" in err, err
    assert f"resume=true run_dir={run}" in err, err
    # Nothing half-written stays, nothing older was pruned, last.pt is the step-128 one.
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["last.pt", "step_000000000064.pt", "step_000000000128.pt"]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 128
    monkeypatch.undo()  # space again: the run continues from step 128 as the line says
    assert train_main(["resume=true", f"run_dir={run}"]) == 0
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 256
    capsys.readouterr()


@needs_dev_full
def test_a_full_disk_at_the_start_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    def no_space(*_):
        raise OSError(errno.ENOSPC, FULL)

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", no_space)  # the lock file's pid
        assert train_main([*RUN, f"run_dir={tmp_path / 'new' / 'a' / 'run'}"]) == 2
    err = one_error_line(capsys)
    assert f"{tmp_path / 'new' / 'a' / 'run' / '.lock'}" in err and FULL in err, err
    assert "the run did not start (the run folder it created was removed)" in err, err
    assert list(tmp_path.iterdir()) == []  # neither the folder nor the parents it made
    full_disk_for(monkeypatch, "config.yaml")
    assert train_main([*RUN, f"run_dir={tmp_path / 'run'}"]) == 2
    err = one_error_line(capsys)
    assert f"cannot write {tmp_path / 'run' / 'config.yaml'}: {FULL}" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_under_the_event_files_is_one_line_too(tmp_path, monkeypatch, capsys):
    from tensorboard.compat.tensorflow_stub.io import gfile

    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setattr(gfile.LocalFileSystem, "append", no_space)  # TensorBoard's writer thread
    run = tmp_path / "run"
    assert train_main([*RUN, f"run_dir={run}", "tensorboard=true"]) == 2
    err = one_error_line(capsys)  # also: no "Exception in thread" traceback of the writer
    assert f"cannot write TensorBoard events in {run / 'tb'}: {FULL}" in err, err
    assert "training stopped at step" in err, err
    monkeypatch.undo()
    mkdir = os.mkdir

    def full_for_tb(path, mode=0o777, *, dir_fd=None):  # a new folder needs a block too
        if str(path) == "tb":
            raise OSError(errno.ENOSPC, FULL)
        return mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", full_for_tb)
    assert train_main([*RUN, f"run_dir={tmp_path / 'run2'}", "tensorboard=true"]) == 2
    err = one_error_line(capsys)
    assert f"cannot write TensorBoard events in {tmp_path / 'run2' / 'tb'}: {FULL}" in err, err


def test_a_collection_that_the_disk_cannot_hold_is_refused_before_writing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    real = os.statvfs

    def nearly_full(path):  # one free 4 KB block: HDF5 would fail inside its own cleanup
        info = real(path)
        return os.statvfs_result((*info[:4], 1, *info[5:]))

    monkeypatch.setattr(os, "statvfs", nearly_full)
    args = ["dataset_id=rltrans/full-v0", "env_id=CartPole-v1", "episodes=3", "progress=false"]
    assert collect_main(args) == 2
    err = one_error_line(capsys)
    assert "cannot write dataset rltrans/full-v0: its 3 episodes need about" in err, err
    assert not (tmp_path / "minari" / "rltrans" / "full-v0").exists()


# ----------------------------------------------------------------------------- a real tmpfs


@contextlib.contextmanager
def mounted(folder: Path, *options: str) -> Iterator[None]:
    """A tmpfs at ``folder`` (skips the test where this process may not mount one)."""
    folder.mkdir(exist_ok=True)
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(folder)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def test_a_real_full_disk_mid_run_and_for_a_dataset(tmp_path, monkeypatch, capsys):
    disk = tmp_path / "disk"
    with mounted(disk, "size=1m"):
        (disk / "fill").write_bytes(b"\0" * 520 * 1024)  # room for two 184 KB checkpoints
        run = disk / "run"
        assert train_main([*RUN, f"run_dir={run}", "tensorboard=false"]) == 2
        err = one_error_line(capsys)
        named = re.search(r"newest complete checkpoint is \S+/step_(\d+)\.pt \(= last\.pt\)", err)
        assert FULL in err and named, err  # the one before the save that did not fit
        assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == int(named[1])
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(disk / "minari"))
        args = ["dataset_id=rltrans/full-v0", "env_id=CartPole-v1", "episodes=40"]
        assert collect_main([*args, "progress=false"]) == 2  # not HDF5's segfault
        assert "cannot write dataset rltrans/full-v0" in one_error_line(capsys)


# ----------------------------------------------------------------------------- read-only


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny finished PPO run on the T-maze (its frames drawn with NumPy)."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    assert train_main([*TINY_PPO, "total_steps=64", "torch_threads=1", f"run_dir={run}"]) == 0
    return run


@contextlib.contextmanager
def read_only_copy(tiny_run: Path, folder: Path) -> Iterator[Path]:
    """``folder`` holding a copy of ``tiny_run`` and an empty folder, made read-only: a
    read-only tmpfs for root, folders without write permission for anyone else."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        with mounted(folder, "size=8m"):
            shutil.copytree(tiny_run, folder / "run")
            (folder / "empty").mkdir()
            ro = ["mount", "-o", "remount,ro", str(folder)]
            if subprocess.run(ro, capture_output=True, check=False).returncode != 0:
                pytest.skip("cannot remount the tmpfs read-only")
            yield folder
        return
    shutil.copytree(tiny_run, folder / "run")
    (folder / "empty").mkdir()
    dirs = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    try:
        yield folder
    finally:
        for d in dirs:
            d.chmod(0o755)


def test_a_read_only_run_folder_is_named_as_not_writable(tiny_run, tmp_path, capsys):
    with read_only_copy(tiny_run, tmp_path / "ro") as ro:
        assert train_main(["resume=true", f"run_dir={ro / 'run'}", "total_steps=128"]) == 2
        err = one_error_line(capsys)
        assert f"run folder {ro / 'run'} is not writable" in err and "link" not in err, err
        assert train_main([*RUN, f"run_dir={ro / 'empty'}"]) == 2
        assert f"run folder {ro / 'empty'} is not writable" in one_error_line(capsys)
        # evaluate video=true: refused before a single episode is played
        assert evaluate_main([f"checkpoint={ro / 'run'}", "video=true", "episodes=1"]) == 2
        err = one_error_line(capsys)
        gif = ro / "run" / "videos" / "eval.gif"
        assert f"{gif} cannot be written: {ro / 'run'} is not writable" in err, err
        # without a video, evaluating a read-only run is fine
        assert evaluate_main([f"checkpoint={ro / 'run'}", "episodes=1"]) == 0
        capsys.readouterr()
