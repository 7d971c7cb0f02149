"""Run-folder writes never leave the folder, and no special file hangs a command.

Each test reproduces a way a hostile folder used to redirect rltrans's writes (a link where a
folder or file is expected, swapped in before or during a run; a user's own folder taken as a
run folder) or to block a command forever (a FIFO where a checkpoint, config or event file is
expected). Commands run in a subprocess or under an alarm, so a regression fails instead of
hanging the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from rltrans.config import ConfigError
from rltrans.config.trust import read_yaml
from rltrans.evaluate import main as evaluate_main
from rltrans.fsutil import UnsafePathError
from rltrans.plot import PlotError, flat_config
from rltrans.plot import main as plot_main
from rltrans.run.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint_file,
)
from rltrans.run.folder import MARKER_FILE
from rltrans.run.logging import MetricLogger
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line
from tests.helpers.hostile import time_limit as no_hang

ROOT = Path(__file__).resolve().parents[2]


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
        through = {"parent_fd": fd} if with_parent_fd else {}
        manager = CheckpointManager(run / "checkpoints", **through)
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


# ----------------------------------------------------------------------------- tb/ mid-run


def test_a_tb_folder_swapped_for_a_link_mid_run_is_refused_and_never_written_through(tmp_path):
    run = tmp_path / "run"
    victim = tmp_path / "victim"
    victim.mkdir()
    logger = MetricLogger(run)
    logger.log(1, {"losses/policy": 1.0})
    logger.flush()
    os.rename(run / "tb", tmp_path / "moved")
    (run / "tb").symlink_to(victim)
    logger.log(2, {"losses/policy": 2.0})
    with pytest.raises(UnsafePathError, match="replaced"):
        logger.flush()
    with pytest.raises(UnsafePathError, match="replaced"):
        logger.close()
    assert list(victim.iterdir()) == []
    # Every event went to the file the logger opened, in the folder it opened.
    (events,) = (tmp_path / "moved").iterdir()
    assert events.stat().st_size > 0


def test_a_linked_tb_folder_is_refused_at_the_start(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (run / "tb").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="link"):
        MetricLogger(run)
    assert list(victim.iterdir()) == []


# ----------------------------------------------------------------------------- run_dir


TINY = [*TINY_PPO, "total_steps=64", "torch_threads=1"]


def error_line(capsys) -> str:
    """The error of a refused in-process command: stderr starts with ``error: ``, no
    traceback."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry below ``folder`` with its bytes (None for folders)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({"config.yaml": "my: own config\n"}, "config.yaml"),
        ({"config.yaml": "my: own\n", "notes.txt": "mine"}, "notes.txt"),
        ({"data.csv": "1,2\n"}, "data.csv"),
    ],
)
def test_a_folder_rltrans_did_not_create_is_refused_and_left_exactly_as_it_was(
    files, named, tmp_path, capsys
):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    before = snapshot(folder)
    assert train_main([*TINY, f"run_dir={folder}"]) == 2
    assert named in error_line(capsys)
    assert snapshot(folder) == before  # no .lock, no marker, config.yaml untouched
    assert resume_main_refuses(folder, capsys)
    assert snapshot(folder) == before


def resume_main_refuses(folder: Path, capsys) -> bool:
    code = train_main(["resume=true", f"run_dir={folder}"])
    error_line(capsys)
    return code == 2


def test_a_run_dir_that_is_a_link_is_refused_but_a_linked_ancestor_is_the_users_layout(
    tmp_path, capsys
):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert train_main([*TINY, f"run_dir={link}"]) == 2
    assert "symbolic link" in error_line(capsys)
    assert list(real.iterdir()) == []
    # A link above the run folder (runs -> /scratch/runs) is the user's own choice.
    assert train_main([*TINY, "tensorboard=false", f"run_dir={link}/run"]) == 0
    capsys.readouterr()
    assert (real / "run" / MARKER_FILE).is_file()
    # resume=true through a link to a run folder is refused as well.
    (tmp_path / "run-link").symlink_to(real / "run")
    assert train_main(["resume=true", f"run_dir={tmp_path / 'run-link'}"]) == 2
    assert "symbolic link" in error_line(capsys)


def test_rltrans_run_folders_resume_with_or_without_the_marker(tiny_run, tmp_path, capsys):
    marked = tmp_path / "marked"
    shutil.copytree(tiny_run, marked, symlinks=True)
    assert (marked / MARKER_FILE).is_file()
    (marked / "curves.png").write_bytes(b"a plot of the user's")  # a marked folder may hold it
    assert train_main(["resume=true", f"run_dir={marked}", "total_steps=128"]) == 0
    legacy = tmp_path / "legacy"  # written before the marker existed
    shutil.copytree(tiny_run, legacy, symlinks=True)
    (legacy / MARKER_FILE).unlink()
    assert train_main(["resume=true", f"run_dir={legacy}", "total_steps=128"]) == 0
    assert (legacy / MARKER_FILE).is_file()
    capsys.readouterr()


# ----------------------------------------------------------------------------- evaluate videos


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny finished PPO run on the T-maze (frames drawn with NumPy), with events."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    assert train_main([*TINY, f"run_dir={run}"]) == 0
    return run


def test_evaluate_refuses_a_linked_videos_folder_like_train(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (run / "videos").symlink_to(victim)
    assert evaluate_main([f"checkpoint={run}", "video=true", "episodes=1"]) == 2
    assert "link" in error_line(capsys)
    assert list(victim.iterdir()) == []


def test_evaluate_video_dir_may_not_be_a_link_nor_its_gif(tiny_run, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "linked").symlink_to(victim)
    args = [f"checkpoint={tiny_run}", "video=true", "episodes=1"]
    assert evaluate_main([*args, f"video_dir={tmp_path / 'linked'}"]) == 2
    assert "link" in error_line(capsys)
    assert list(victim.iterdir()) == []
    real = tmp_path / "videos"
    real.mkdir()
    (victim / "keep.gif").write_bytes(b"keep")
    (real / "eval.gif").symlink_to(victim / "keep.gif")
    assert evaluate_main([*args, f"video_dir={real}"]) == 2
    assert "link" in error_line(capsys)
    assert (victim / "keep.gif").read_bytes() == b"keep"
    fresh = tmp_path / "new" / "videos"
    assert evaluate_main([*args, f"video_dir={fresh}"]) == 0
    assert summary_line(capsys.readouterr().out)["video"] == str(fresh / "eval.gif")
    assert (fresh / "eval.gif").read_bytes().startswith(b"GIF")


# ----------------------------------------------------------------------------- plot outputs


@pytest.mark.parametrize("key", ["out", "csv"])
def test_plot_never_writes_through_a_link(key, tiny_run, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    paths = {"out": tmp_path / "c.png", "csv": tmp_path / "c.csv"}
    paths[key].symlink_to(victim)
    args = [str(tiny_run), "tag=charts/SPS", *(f"{k}={v}" for k, v in paths.items())]
    assert plot_main(args) == 2
    assert "symbolic link" in error_line(capsys)
    assert victim.read_text() == "keep"
    assert not any(p.exists() and not p.is_symlink() for p in paths.values())


# ----------------------------------------------------------------------------- FIFOs


def test_a_fifo_where_last_pt_is_expected_hangs_neither_evaluate_nor_resume(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    for step_file in (run / "checkpoints").glob("step_*.pt"):
        step_file.unlink()
    (run / "checkpoints" / "last.pt").unlink()
    os.mkfifo(run / "checkpoints" / "last.pt")
    refused(cli("evaluate", f"checkpoint={run}", "episodes=1"), "FIFO")
    refused(cli("evaluate", f"checkpoint={run / 'checkpoints' / 'last.pt'}"), "FIFO")
    refused(cli("train", "resume=true", f"run_dir={run}"), "no checkpoint")
    # A FIFO as the run's config.yaml: refused, not read.
    (run / "config.yaml").unlink()
    os.mkfifo(run / "config.yaml")
    refused(cli("train", "resume=true", f"run_dir={run}"), "FIFO")
    with no_hang(), pytest.raises(ConfigError, match="FIFO"):
        read_yaml(run / "config.yaml")


def test_a_fifo_event_file_does_not_hang_plot(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    (events,) = (run / "tb").iterdir()
    events.unlink()
    os.mkfifo(events)
    refused(cli("plot", str(run), f"out={tmp_path / 'c.png'}", f"csv={tmp_path / 'c.csv'}"), "FIFO")
    (run / "config.yaml").unlink()
    os.mkfifo(run / "config.yaml")
    with no_hang(), pytest.raises(PlotError, match="FIFO"):
        flat_config(run)


# ----------------------------------------------------------------------------- link loops


def test_a_symlink_loop_given_as_a_path_is_one_error_line(tiny_run, tmp_path, monkeypatch, capsys):
    from rltrans import load_policy
    from rltrans.collect import main as collect_main

    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    loop = tmp_path / "loop1"
    assert evaluate_main([f"checkpoint={loop}"]) == 2
    assert f"{loop} is or passes through a symbolic link loop" in error_line(capsys)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    assert collect_main([f"policy={loop}", "dataset_id=rltrans/loop-v0", "episodes=1"]) == 2
    assert f"{loop} is or passes through a symbolic link loop" in error_line(capsys)
    with pytest.raises(CheckpointError, match="symbolic link loop"):
        load_policy(loop)
    # A run folder's last.pt that is a loop, and paths below a loop.
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    (run / "checkpoints" / "last.pt").unlink()
    (run / "checkpoints" / "last.pt").symlink_to(loop)
    assert evaluate_main([f"checkpoint={run}"]) == 2
    assert "symbolic link loop" in error_line(capsys)
    assert train_main([*TINY, f"run_dir={loop}/run"]) == 2
    assert f"{loop} is a symbolic link to no folder (a loop" in error_line(capsys)
    args = [f"checkpoint={tiny_run}", "video=true", "episodes=1", f"video_dir={loop}/videos"]
    assert evaluate_main(args) == 2  # refused before an episode is played, not at the end
    assert f"{loop} is or passes through a symbolic link loop" in error_line(capsys)
