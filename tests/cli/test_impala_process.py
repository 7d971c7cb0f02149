"""IMPALA end to end with ``runtime=process`` (actor processes, shared-memory slots) on
CartPole with the mlp agent and 2 actors: a short CLI run (checkpoints, policy-lag metrics,
the summary), stale rollouts dropped and counted at ``algo.max_policy_lag=0``, and a learner
SIGKILLed after its first checkpoint: the resume continues the step count, and no actor of
the killed run is left alive.

Every test starts real (spawned) processes: each is bounded by a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from tests.cli.test_resume import ROOT, scalars, wait_for_a_new_second
from tests.helpers.cli import summary_line
from tests.runtime.test_process_pool import _descendants, _leftovers

try:  # pytest-timeout (a dev dependency); every wait below has its own timeout anyway
    import pytest_timeout  # noqa: F401

    pytestmark = pytest.mark.timeout(120)
except ImportError:
    pytestmark = []

STEPS_PER_UPDATE = 16 * 2  # algo.num_steps x runtime.envs_per_actor (batch_rollouts = 1)
TINY = [
    "agent=mlp",
    "algo=impala",
    "runtime=process",
    "runtime.num_actors=2",
    "runtime.envs_per_actor=2",
    "env=gym",
    "env.id=CartPole-v1",
    "env.num_envs=2",
    "algo.num_steps=16",
    "algo.segment_length=8",
    "agent.dim=16",
    "progress=false",
    "torch_threads=1",
]


def histograms(run: Path) -> dict[str, list]:
    """Every histogram tag of a run: its events in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"histograms": 0})
    acc.Reload()
    return {tag: acc.Histograms(tag) for tag in acc.Tags()["histograms"]}


@pytest.fixture(autouse=True)
def _no_orphans():
    """Every test must leave no child process of this process alive (the trainer closes its
    pool; multiprocessing's resource tracker, started once, is not counted)."""
    before = set(_descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 5
    while _leftovers(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _leftovers(before), {p: cmdline(p) for p in _leftovers(before)}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def orphans_of(parent: int, marker: str) -> list[int]:
    """Live processes whose parent ``parent`` is gone and whose command line or environment
    carries ``marker`` (spawned actors inherit the environment of the killed run)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        marked = marker.encode() in environ or marker in cmdline(pid)
        if marked and pid != parent and alive(pid):
            found.append(pid)
    return found


def test_cli_run_checkpoints_logs_policy_lag_and_dropped(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY, f"run_dir={run}", "total_steps=192", "checkpoint_every=2"]
    assert train_main(args) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == 192
    assert summary["updates"] == 6
    assert "dropped_rollouts" in summary and summary["dropped_rollouts"] >= 0
    names = sorted(p.name for p in (run / "checkpoints").glob("*.pt"))
    assert "last.pt" in names and "step_000000000192.pt" in names
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 192
    tags = scalars(run)
    lags = tags["perf/policy_lag"]
    assert [s for s, _ in lags] == [32 * (i + 1) for i in range(6)]
    assert all(value >= 0 for _, value in lags)
    for tag in ("perf/dropped_rollouts", "perf/queue_wait_ms", "perf/env_ms", "perf/act_ms"):
        assert tag in tags, tag
    hist = histograms(run)["perf/policy_lag"]
    assert len(hist) == 6
    assert all(h.histogram_value.min >= 0 and h.histogram_value.num == 1 for h in hist)


def test_max_policy_lag_zero_drops_stale_rollouts_and_counts_them(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY, "algo.max_policy_lag=0", f"run_dir={run}", "total_steps=192"]
    assert train_main(args) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == 192
    assert summary["dropped_rollouts"] > 0  # 2 actors: the other's rollout is one version old
    tags = scalars(run)
    assert all(value == 0 for _, value in tags["perf/policy_lag"])  # only fresh ones trained
    dropped = [value for _, value in tags["perf/dropped_rollouts"]]
    assert dropped == sorted(dropped) and dropped[-1] == summary["dropped_rollouts"]


def test_sigkill_learner_then_resume_continues_and_leaves_no_actor(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY, f"run_dir={run}", "checkpoint_every=1"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "RLTRANS_TEST_RUN": str(run),  # marks the killed run's processes (actors inherit it)
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltrans.train", *args, "total_steps=32000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    actors: list[int] = []
    try:
        first = run / "checkpoints" / "last.pt"
        deadline = time.monotonic() + 60
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first.exists(), proc.stderr.read().decode() if proc.poll() is not None else ""
        actors = [p for p in _descendants(proc.pid) if "spawn_main" in cmdline(p)]
        assert len(actors) == 2, [cmdline(p) for p in _descendants(proc.pid)]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()

    deadline = time.monotonic() + 10  # actors notice their parent is gone within ~0.2 s
    while any(alive(p) for p in actors) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in actors if alive(p)]
    for pid in left:  # do not leave them behind, but fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"actors of the killed learner still alive after 10 s: {left}"
    deadline = time.monotonic() + 5
    while orphans_of(proc.pid, str(run)) and time.monotonic() < deadline:
        time.sleep(0.05)
    stray = {p: cmdline(p) for p in orphans_of(proc.pid, str(run))}
    assert not stray, f"processes of the killed run still alive: {stray}"

    # The kill may land after a later checkpoint than the first: resume from the latest.
    step = load_checkpoint(run / "checkpoints" / "last.pt")["global_step"]
    assert step > 0 and step % STEPS_PER_UPDATE == 0
    logged = [s for s, _ in scalars(run)["losses/value"]]
    assert step in logged and max(logged) < 32000
    wait_for_a_new_second(run)
    total = step + 2 * STEPS_PER_UPDATE
    assert train_main([*args, "resume=true", f"total_steps={total}"]) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == total
    assert summary["updates"] == total // STEPS_PER_UPDATE
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == total
    steps = [s for s, _ in scalars(run)["losses/value"]]
    assert steps == sorted(set(steps))  # nothing logged twice across the kill
    assert steps[-2:] == [step + STEPS_PER_UPDATE, total]
