"""Stopping on SIGINT / SIGTERM: a run finishes its update, writes the checkpoint a periodic
one would, prints its summary with status "interrupted" and exits 130 / 143; resumed from
that checkpoint it ends exactly as a run that checkpointed at the same update (PPO, IMPALA
runtime=local, offline DT); actor processes outlive a Ctrl-C to the whole process group
until the learner closes them (runtime=process, ray); under torchrun a signal to one
learner process stops every one after the same update; a second signal ends the run at
once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest

from rltrans.collect import main as collect_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from rltrans.trainers.skeleton import COPY_SHARE, LONG_UPDATE_S, copy_due
from rltrans.trainers.stop import StopSignals
from tests.cli.test_resume import assert_same_run, wait_for_a_new_second
from tests.helpers.cli import TINY_PPO, summary_line
from tests.learners.test_impala import TINY as TINY_IMPALA
from tests.runtime.test_process_pool import _descendants

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["progress=false", "compile=false", "torch_threads=1"]
# Budgets far beyond what a test runs (a signal ends them), without lr annealing: the lr
# schedule then does not depend on the budget, which the resumed run changes.
PPO = [*TINY_PPO, *QUIET, "algo.anneal_lr=false", "checkpoint_every=1000"]
IMPALA_LOCAL = [*TINY_IMPALA, *QUIET, "algo.anneal_lr=false", "checkpoint_every=1000"]
ENDLESS = "total_steps=64000000"  # 10^6 updates of 64 steps


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Training:
    """``python -m rltrans.train <args> progress=true`` (or ``python <argv>``) in a subprocess
    leading a process group of its own (as a job started from a terminal), printing a
    progress line per update to a file."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        extra_env: dict | None = None,
        *,
        argv: list[str] | None = None,
    ) -> None:
        self.err_path = cwd / f"stderr-{time.monotonic_ns()}.txt"
        env = {
            **os.environ,
            **(extra_env or {}),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
            "RLTRANS_PROGRESS_EVERY_S": "0",  # progress=true: one line per update
        }
        args = [*[a for a in args if not a.startswith("progress=")], "progress=true"]
        if argv is None:
            argv = ["-m", "rltrans.train", *args]
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *argv],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for_updates(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` progress lines are out (the loop runs with its handlers set)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = [line for line in self.stderr().splitlines() if line.startswith("train:")]
            if len(lines) >= count:
                return
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.stderr()}"
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no {count} updates in {timeout} s:\n{self.stderr()}")

    def signal(self, sig: signal.Signals, *, group: bool = False) -> None:
        """Send ``sig`` to the trainer, or to its whole process group (a terminal's Ctrl-C)."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 90) -> tuple[int, str, str]:
        """Exit code, stdout and stderr once it ends."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            self.kill()
        return self.proc.returncode, out, self.stderr()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> Training:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # a failed test leaves no training behind


def assert_interrupted(
    returned: tuple[int, str, str], sig: signal.Signals, run: Path, step_key: str = "global_step"
) -> dict:
    """Exit 128 + signal, no traceback, summary and stderr line naming the signal, and the
    checkpoint of the last update done."""
    code, out, err = returned
    assert code == 128 + sig, f"exit {code}:\n{err[-3000:]}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    summary = summary_line(out)
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name, summary
    step = summary[step_key]
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == step > 0
    assert summary["checkpoint"] == str(run / "checkpoints" / "last.pt")
    said = [line for line in err.splitlines() if line.startswith(f"rltrans: {sig.name}")]
    assert len(said) == 1 and f"at step {step} " in said[0] and summary["checkpoint"] in said[0]
    return summary


def stop_resume_and_compare(args: list[str], tmp_path: Path, sig: signal.Signals) -> None:
    """Stop a run with ``sig`` after at least 3 updates of 64 steps, resume it for 2 more, and
    compare with one run of the same budget that checkpoints at the stopped update."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    with Training([*args, ENDLESS, f"run_dir={stopped}"], tmp_path) as training:
        training.wait_for_updates(3)
        training.signal(sig)
        summary = assert_interrupted(training.finish(), sig, stopped)
    updates = summary["updates"]
    assert summary["global_step"] == 64 * updates
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["update"] == updates

    total = f"total_steps={64 * (updates + 2)}"
    wait_for_a_new_second(stopped)
    assert train_main(["resume=true", f"run_dir={stopped}", total, "progress=false"]) == 0
    # One checkpoint at the stopped update (and the last): envs restart there as in the
    # stopped run, whose resume started them afresh.
    assert train_main([*args, total, f"checkpoint_every={updates}", f"run_dir={whole}"]) == 0
    assert_same_run(stopped, whole, checkpoint_step=64 * updates)


# ----------------------------------------------------------------------------- PPO


def test_ppo_sigterm_checkpoints_the_update_and_resumes_as_an_uninterrupted_run(tmp_path, capsys):
    stop_resume_and_compare(PPO, tmp_path, signal.SIGTERM)


def test_ppo_sigint_exits_130_without_a_traceback(tmp_path):
    run = tmp_path / "run"
    with Training([*PPO, ENDLESS, f"run_dir={run}"], tmp_path) as training:
        training.wait_for_updates(2)
        training.signal(signal.SIGINT, group=True)  # Ctrl-C in a terminal
        assert_interrupted(training.finish(), signal.SIGINT, run)


def test_ppo_with_async_envs_exits_130_on_ctrl_c(tmp_path):
    """A terminal's Ctrl-C reaches the async env workers too: they ignore it, and the
    trainer closes them after its checkpoint."""
    run = tmp_path / "run"
    args = [*PPO, "env=gym", "env.id=CartPole-v1", "env.vectorization=async", ENDLESS]
    with Training([*args, f"run_dir={run}"], tmp_path) as training:
        training.wait_for_updates(2)
        training.signal(signal.SIGINT, group=True)
        assert_interrupted(training.finish(), signal.SIGINT, run)


class SlowAfter(gym.Wrapper):
    """Test wrapper: every step after the first ``after`` sleeps ``seconds`` (those before,
    ``before_seconds``); closing sleeps ``close_seconds``."""

    def __init__(
        self,
        env: gym.Env,
        after: int = 0,
        seconds: float = 1.0,
        close_seconds: float = 0.0,
        before_seconds: float = 0.0,
    ) -> None:
        super().__init__(env)
        self.after, self.seconds, self.count = after, seconds, 0
        self.close_seconds, self.before_seconds = close_seconds, before_seconds

    def step(self, action):
        self.count += 1
        if self.count > self.after:
            time.sleep(self.seconds)
        elif self.before_seconds:
            time.sleep(self.before_seconds)
        return self.env.step(action)

    def close(self):
        time.sleep(self.close_seconds)
        return super().close()


def _slow(after: int, seconds: float, close_seconds: float = 0.0, before: float = 0.0) -> str:
    kwargs = f"after: {after}, seconds: {seconds}, close_seconds: {close_seconds}"
    kwargs += f", before_seconds: {before}"
    return f"env.wrappers=[{{path: tests.cli.test_stop.SlowAfter, kwargs: {{{kwargs}}}}}]"


def test_a_copy_is_made_where_it_is_cheap_and_dear_ones_are_spaced_to_their_share():
    """First update, long updates and cheap copies: always. A copy of 2.5 % of an update:
    every third update (0.83 % of the time on average)."""
    assert copy_due(None, None, 1) and copy_due(0.1, None, 1)
    assert copy_due(LONG_UPDATE_S, 10.0, 1)
    assert copy_due(0.1, COPY_SHARE * 0.1, 1)
    dear = 2.5 * COPY_SHARE * 0.1
    assert [copy_due(0.1, dear, since) for since in (1, 2, 3)] == [False, False, True]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_long_update_is_answered_within_seconds(sig, tmp_path):
    """Two updates of 512 steps of 2.5 ms each (1.3 s: an update long enough to copy before
    it whatever else the machine runs), then every env step sleeps 1 s: the third update
    would take over eight minutes. The signal drops it: the checkpoint is the state after the
    second update, written within seconds, and the run resumes from it."""
    longer = [a if a != "algo.num_steps=16" else "algo.num_steps=128" for a in PPO]
    args = ["env=gym", "env.id=CartPole-v1", _slow(256, 1.0, before=0.0025), *longer, ENDLESS]
    run = tmp_path / "run"
    with Training([*args, f"run_dir={run}"], tmp_path) as t:
        t.wait_for_updates(2)
        time.sleep(2.0)  # well into the third update's rollout
        start = time.monotonic()
        t.signal(sig, group=sig == signal.SIGINT)  # SIGINT as a terminal's Ctrl-C sends it
        returned = t.finish(timeout=60)
    assert time.monotonic() - start < 10, returned[2][-2000:]
    summary = assert_interrupted(returned, sig, run)
    assert summary["global_step"] == 1024 and summary["updates"] == 2
    assert "the update under way dropped" in returned[2]
    resume = ["resume=true", f"run_dir={run}", "total_steps=1536", "trust_env_code=true"]
    assert train_main([*resume, "progress=false"]) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once_with_one_line_and_the_checkpoint_kept(sig, tmp_path):
    """The first signal's checkpoint is written, then closing the envs takes a minute; a
    second signal ends the process at once: one line, 128 + its number, no traceback, and
    the checkpoint loads."""
    args = ["env=gym", "env.id=CartPole-v1", _slow(1_000_000, 0.0, close_seconds=60.0), *PPO]
    run = tmp_path / "run"
    with Training([*args, ENDLESS, f"run_dir={run}"], tmp_path) as training:
        training.wait_for_updates(2)
        training.signal(sig)
        deadline = time.monotonic() + 30
        while "training stopped at step" not in training.stderr():  # closing the envs now
            assert time.monotonic() < deadline, training.stderr()
            time.sleep(0.05)
        time.sleep(1.5)  # past the repeat window
        start = time.monotonic()
        training.signal(sig)
        code, out, err = training.finish(timeout=30)
    assert time.monotonic() - start < 5
    assert code == 128 + sig and not out.strip()  # no summary line: it never got there
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("rltrans: second")]
    assert (
        line
        == f"rltrans: second {sig.name}: exiting now; checkpoint {run}/checkpoints/last.pt is kept"
    )
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] > 0


# ----------------------------------------------------------------------------- IMPALA


def test_impala_local_sigterm_resumes_as_an_uninterrupted_run(tmp_path, capsys):
    stop_resume_and_compare(IMPALA_LOCAL, tmp_path, signal.SIGTERM)


PROCESS = [
    *[a for a in IMPALA_LOCAL if not a.startswith("runtime=")],
    "runtime=process",
    "runtime.num_actors=2",
]


def _ctrl_c_leaves_actors_to_the_learner(args: list[str], tmp_path: Path, actor_mark: str):
    """Ctrl-C (SIGINT to the process group) a run with actors in other processes: the learner
    checkpoints and exits 130, no actor dies before (no restart), and none is left."""
    run = tmp_path / "run"
    with Training([*args, ENDLESS, f"run_dir={run}"], tmp_path) as training:
        training.wait_for_updates(3)
        actors = [p for p in _descendants(training.proc.pid) if actor_mark in _cmdline(p)]
        assert actors, "no actor process found"
        training.signal(signal.SIGINT, group=True)
        returned = training.finish()
    assert_interrupted(returned, signal.SIGINT, run)
    assert "died" not in returned[2], returned[2][-3000:]  # no actor restarted
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in actors) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in actors if _alive(p)], "actors outlived their learner"


def test_impala_process_ctrl_c_stops_actors_as_a_normal_finish(tmp_path):
    _ctrl_c_leaves_actors_to_the_learner(PROCESS, tmp_path, "spawn_main")


def test_impala_ray_ctrl_c_stops_actors_as_a_normal_finish(tmp_path):
    pytest.importorskip("ray", reason='runtime=ray needs Ray: pip install -e ".[ray]"')
    ray_args = [a.replace("runtime=process", "runtime=ray") for a in PROCESS]
    ray_args += ["runtime.num_cpus_per_actor=0.5", "runtime.object_store_memory=100000000"]
    _ctrl_c_leaves_actors_to_the_learner(ray_args, tmp_path, "ray::")


@pytest.mark.parametrize("who", ["rank 1", "the group"])
def test_torchrun_learners_stop_together_after_the_same_update(who, tmp_path):
    """SIGTERM to learner process 1 only: process 0 stops after the same update (the flag is
    agreed on every update). Ctrl-C to the group: every process gets SIGINT twice (from the
    terminal and forwarded by torchrun), which is one request. Either way rank 0 writes the
    checkpoint with both processes' reward scalers (a collective: processes stopping after
    different updates would hang) and names the signal in its summary."""
    run = tmp_path / "run"
    argv = [
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "rltrans.train", "agent=mlp", "algo=impala", "env=gym", "env.id=CartPole-v1",
        "env.num_envs=2", "algo.num_steps=16", "algo.segment_length=8", "agent.dim=16",
        "compile=false", "progress=true", "checkpoint_every=1000", ENDLESS, f"run_dir={run}",
    ]  # fmt: skip
    sig = signal.SIGTERM if who == "rank 1" else signal.SIGINT
    with Training([], tmp_path, argv=argv) as training:
        training.wait_for_updates(3)
        if who == "rank 1":
            os.kill(_learner_pids(training.proc.pid)[1], sig)
        else:
            training.signal(sig, group=True)
        code, out, err = training.finish(timeout=120)
    assert code != 0  # torchrun's own: its processes exited with 128 + the signal
    summary = summary_line(out)  # rank 0's
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name, err[-3000:]
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == summary["global_step"]
    assert len(payload["reward_scalers"]["by_rank"]) == 2
    assert err.count(f"rltrans: {sig.name}: training stopped") == 1, err[-3000:]  # rank 0's
    assert "KeyboardInterrupt" not in err, err[-3000:]


def _learner_pids(torchrun_pid: int) -> dict[int, int]:
    """The learner processes torchrun started, by rank."""
    ranks = {}
    for pid in _descendants(torchrun_pid):
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        if b"RANK" in variables and "rltrans.train" in _cmdline(pid):
            ranks[int(variables[b"RANK"])] = pid
    assert sorted(ranks) == [0, 1], ranks
    return ranks


# ----------------------------------------------------------------------------- offline

DT = ["agent=dt", "agent.dim=16", "agent.layers=1", "agent.context=4", "algo.batch_size=8"]
DT += ["algo.eval_episodes=0", "algo.warmup_updates=0", "algo.log_every=1000", *QUIET]


@pytest.fixture
def minari(tmp_path, monkeypatch, capsys) -> dict[str, str]:
    """A small CartPole dataset (rltrans/cp-stop-v0) and the environment that finds it."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    args = [
        "dataset_id=rltrans/cp-stop-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "epsilon=[0,1]",
        "episodes=4",
        "max_episode_steps=40",
        "progress=false",
    ]
    assert collect_main(args) == 0
    capsys.readouterr()
    return {"MINARI_DATASETS_PATH": str(tmp_path / "minari")}


def test_offline_sigterm_checkpoints_the_step_and_resumes_as_an_uninterrupted_run(
    minari, tmp_path, capsys
):
    args = [*DT, "dataset=rltrans/cp-stop-v0"]
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    endless = "train_steps=10000000"
    with Training([*args, endless, f"run_dir={stopped}"], tmp_path, minari) as training:
        training.wait_for_updates(20)
        training.signal(signal.SIGTERM)
        summary = assert_interrupted(training.finish(), signal.SIGTERM, stopped, "train_steps")
    steps = summary["train_steps"]
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["update"] == steps

    total = f"train_steps={steps + 5}"
    assert train_main(["resume=true", f"run_dir={stopped}", total, "progress=false"]) == 0
    assert summary_line(capsys.readouterr().out)["train_steps"] == steps + 5
    assert train_main([*args, total, f"run_dir={whole}"]) == 0
    a = load_checkpoint(stopped / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(whole / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in b)


# ----------------------------------------------------------------------------- the handlers


def test_first_signal_is_recorded_and_the_previous_handlers_come_back():
    seen = []

    def previous(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with StopSignals(repeat_s=0.0) as stop:
            assert not stop.poll() and stop.name is None
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs at the next bytecode
            assert stop.poll() and stop.name == "SIGTERM" and not seen
            assert stop.summary("interrupted") == {"signal": "SIGTERM"}
            os.kill(os.getpid(), signal.SIGTERM)  # the second: the previous handler's
            time.sleep(0.01)
            assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_repeat_within_a_second_counts_as_the_first_signal():
    """Under torchrun a terminal's Ctrl-C reaches a learner twice (from the terminal and
    forwarded by torchrun): that is one request to stop, not two."""
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt if it counted
        time.sleep(0.01)
        assert stop.poll() and stop.name == "SIGINT"


def test_outside_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    polled = []

    def body():
        with StopSignals() as stop:
            polled.append(stop.poll())
            polled.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert polled == [False, before]


def test_ctrl_c_during_a_compile_is_answered_within_seconds(tmp_path):
    """compile=true compiles in the first update (tens of seconds): a terminal's Ctrl-C there
    drops the update and checkpoints the state before it, within seconds, without a
    traceback from the compiler; the run resumes from that checkpoint."""
    run = tmp_path / "run"
    args = [*[a for a in PPO if a != "compile=false"], "compile=true", ENDLESS]
    with Training([*args, f"run_dir={run}"], tmp_path) as training:
        deadline = time.monotonic() + 120
        while "compile=true:" not in training.stderr():
            assert training.proc.poll() is None and time.monotonic() < deadline, training.stderr()
            time.sleep(0.05)
        time.sleep(3.0)  # inside the compile (the first update lasts far longer)
        assert "train:" not in training.stderr()
        start = time.monotonic()
        training.signal(signal.SIGINT, group=True)
        code, out, err = training.finish(timeout=60)
    assert time.monotonic() - start < 10, err[-3000:]
    assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    summary = summary_line(out)
    assert summary["status"] == "interrupted" and summary["global_step"] == 0
    assert "the update under way dropped" in err
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 0


def test_the_command_lines_exit_at_once_ends_with_the_command(tmp_path):
    """A second signal exits at once only while a command runs: a test or a notebook that
    called ``main`` keeps Python's handling afterwards (a sticky setting once ended a test
    session at its next second signal)."""
    from rltrans.trainers import stop

    assert train_main([*PPO, "total_steps=64", f"run_dir={tmp_path / 'run'}"]) == 0
    assert stop.EXIT_AT_ONCE is False


def test_a_dropped_update_checkpoints_what_a_checkpoint_after_the_last_one_holds(
    tmp_path, monkeypatch, capsys
):
    """A signal in the middle of update 3 (after its rollout, before its learning) drops it:
    the checkpoint equals, tensor for tensor, the one a run of 2 updates writes at its end
    (weights, optimizer moments, RNG states, counters)."""
    import torch

    from rltrans.trainers.ppo import PPOTrainer

    real = PPOTrainer.update
    calls = []

    def update_then_signal(self):
        calls.append(1)
        if len(calls) == 3:  # as if Ctrl-C came while this update learns
            self.learner.update = lambda buffer: os.kill(os.getpid(), signal.SIGTERM)
        return real(self)

    both = [*PPO, "algo.num_steps=128"]  # updates of 512 steps: copied before each
    assert train_main([*both, "total_steps=1024", f"run_dir={tmp_path / 'two'}"]) == 0
    monkeypatch.setattr(PPOTrainer, "update", update_then_signal)
    code = train_main([*both, ENDLESS, f"run_dir={tmp_path / 'dropped'}"])
    assert code == 143 and "the update under way dropped" in capsys.readouterr().err
    a = load_checkpoint(tmp_path / "dropped" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "two" / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"] == 1024 and a["update"] == b["update"] == 2

    def same(x, y, where):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=where)
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for key in x:
                same(x[key], y[key], f"{where}.{key}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                same(u, v, f"{where}[{i}]")
        else:
            assert x == y, where

    for part in ("model", "learner", "rng", "episodes", "reward_scaler"):
        same(a[part], b[part], part)
