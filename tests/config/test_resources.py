"""The one resource estimate (rltrans.config.resources), made once every setting is final: each
test is a size that used to pass the checks and then allocate or spawn. A refusal is exit
code 2, one ``error:`` line, no traceback, no run folder, and less than 500 MB of peak RSS.

The machine's RAM is pinned to 16 GiB here, and the address space of the test process is
capped a few GiB above what it holds, so a size that slips through fails fast instead of
exhausting the machine."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from rltrans import load_policy
from rltrans.collect import main as collect_main
from rltrans.config import load_config, to_container
from rltrans.config.resources import MAX_ACTORS, MAX_THREADS, estimate, resource_problems
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import CheckpointError
from rltrans.spaces import serialize_space
from rltrans.train import main as train_main
from tests.cli import test_trust as trust
from tests.cli.test_trust import DT_TINY, copy_run, edit_checkpoint, edit_eval_spec
from tests.helpers.cli import TINY_PPO

cartpole_run, dataset = trust.cartpole_run, trust.dataset  # the same fixtures

RAM = 16 * 2**30
HEADROOM = 6 * 2**30  # address space the guard leaves above what the process maps
RSS_GROWTH = 500 * 2**20


def _mapped() -> int:
    """Bytes of address space this process maps now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(autouse=True)
def guard(monkeypatch):
    """16 GiB of RAM for the estimate; an address-space cap for what gets past it."""
    from rltrans.config import resources

    monkeypatch.setattr(resources, "physical_memory", lambda: RAM)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _mapped() + HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def refused(main, args: list[str], capsys) -> str:
    """Run a CLI, assert the refusal form and a small peak RSS; return the error text."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    code = main(args)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert grown < RSS_GROWTH, f"peak RSS grew by {grown / 2**20:.0f} MB"
    return err


def train_refused(args: list[str], tmp_path, capsys) -> str:
    """A refused training run that left no run folder."""
    err = refused(train_main, [*args, f"run_dir={tmp_path}/run", "progress=false"], capsys)
    assert not (tmp_path / "run").exists()
    return err


# ----------------------------------------------------------------------------- checkpoints


def test_a_checkpoints_huge_action_space_is_refused_before_its_head_is_built(
    cartpole_run, tmp_path, capsys
):
    run = copy_run(cartpole_run, tmp_path / "run")
    huge = serialize_space(gym.spaces.Discrete(2**26))  # exactly MAX_SPACE_SIZE
    path = edit_checkpoint(run / "checkpoints" / "last.pt", lambda p: p.update(action_space=huge))
    err = refused(evaluate_main, [f"checkpoint={path}", "episodes=1"], capsys)
    assert "action spaces need at least" in err and "agent.dim" in err
    with pytest.raises(CheckpointError, match="weights hold"):
        load_policy(path)


def test_evaluate_combines_its_num_envs_with_the_checkpoints_memory(cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    path = edit_checkpoint(
        run / "checkpoints" / "last.pt", lambda p: p["config"]["agent"].update(memory=65536)
    )
    err = refused(evaluate_main, [f"checkpoint={path}", "num_envs=65536"], capsys)
    assert "acting in 65536 envs needs at least" in err and "acting state" in err
    assert "num_envs" in err and "agent.memory" in err


def test_collect_combines_its_num_envs_with_the_checkpoints_memory(
    cartpole_run, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    run = copy_run(cartpole_run, tmp_path / "run")
    path = edit_checkpoint(
        run / "checkpoints" / "last.pt", lambda p: p["config"]["agent"].update(memory=65536)
    )
    args = ["dataset_id=rltrans/big-v0", f"policy={path}", "episodes=65536", "num_envs=65536"]
    err = refused(collect_main, [*args, "progress=false"], capsys)
    assert "acting in 65536 envs needs at least" in err and "acting state" in err
    assert not (tmp_path / "minari" / "rltrans" / "big-v0" / "data").exists()


# ----------------------------------------------------------------------------- training sizes


@pytest.mark.parametrize(
    ("args", "part", "key"),
    [
        (
            ["agent.position=learned", "+agent.max_len=1048576", "agent.dim=4096"],
            "positional tables",
            "agent.max_len",
        ),
        (
            ["agent.position=shaw", "+agent.shaw_max_distance=1048576", "agent.dim=4096"],
            "positional tables",
            "agent.shaw_max_distance",
        ),
        (
            ["env=autoencode", "env.kwargs.length=1048576", "env.num_envs=4096"],
            None,
            "env.num_envs",
        ),
        (
            ["agent.long_memory=compressive", "agent.compressed_slots=1048576"],
            "acting state",
            "agent.compressed_slots",
        ),
        (
            ["algo=impala", "runtime=process", "runtime.slots=1048576", "env.num_envs=64"],
            "actor slots",
            "runtime.slots",
        ),
        (
            ["algo=impala", "runtime=process", f"runtime.num_actors={MAX_ACTORS}"],
            "actor processes",
            "runtime.num_actors",
        ),
    ],
)
def test_a_size_the_machine_cannot_hold_is_refused_before_the_run_starts(
    args, part, key, tmp_path, capsys
):
    tiny = [a for a in TINY_PPO if not a.startswith(("algo.num_minibatches", "agent.memory"))]
    err = train_refused([*tiny, *args], tmp_path, capsys)
    assert "needs at least" in err and "16.0 GiB" in err and key in err, err
    if part:
        assert f"largest part, {part}" in err, err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["runtime.slots=1000000000"], "runtime.slots=1000000000: expected null or an integer"),
        (["runtime.num_actors=4096"], f"expected an integer in [1, {MAX_ACTORS}]"),
    ],
)
def test_impala_counts_have_upper_bounds(args, expected, tmp_path, capsys):
    err = train_refused(["algo=impala", "runtime=process", *TINY_PPO, *args], tmp_path, capsys)
    assert expected in err


def test_the_estimate_runs_after_the_horizon_fit(tmp_path, capsys):
    assert load_config(["agent.horizon=1048576"]).agent.memory == 32  # fine before the fit
    err = train_refused(["agent.horizon=1048576"], tmp_path, capsys)
    assert "needs at least" in err and "agent.horizon=1048576 fitted" in err


def test_a_budget_smaller_than_one_long_update_is_refused(tmp_path, capsys):
    args = ["agent.horizon=1048576", "env.num_envs=1", "agent.dim=16", "total_steps=100000"]
    err = train_refused(args, tmp_path, capsys)
    assert "total_steps=100000 is less than one update" in err and "1048576 steps" in err


def test_a_short_rounding_up_still_runs_with_its_notice(tmp_path, capsys):
    args = [*TINY_PPO, "total_steps=2", f"run_dir={tmp_path}/run", "tensorboard=false"]
    assert train_main(args) == 0  # 32 x the budget, but one update is 64 steps
    assert "total_steps=2 rounded up to 64" in capsys.readouterr().err


class HugeActions(gym.Env):
    """A Gymnasium env whose action space alone sizes a head no machine here holds."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,))
    action_space = gym.spaces.Discrete(2**26)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_a_trained_envs_spaces_are_counted_before_the_agent_is_built(algo, tmp_path, capsys):
    gym.register("RltransHugeActions-v0", entry_point=f"{__name__}:HugeActions")
    try:
        args = ["env=gym", "env.id=RltransHugeActions-v0", "env.num_envs=2", "agent.dim=64"]
        args += ["algo.num_minibatches=1", "algo.segment_length=16"]
        if algo == "impala":
            args += ["algo=impala", "runtime=local"]
        err = train_refused([*args, "algo.num_steps=16", "total_steps=16"], tmp_path, capsys)
    finally:
        gym.registry.pop("RltransHugeActions-v0")
    assert "the observation and action spaces" in err, err


# ----------------------------------------------------------------------------- threads


@pytest.mark.parametrize("main", [train_main, evaluate_main, collect_main])
def test_torch_threads_has_an_upper_bound(main, tmp_path, capsys):
    folder = [f"run_dir={tmp_path}/run"] if main is train_main else []
    err = refused(main, ["torch_threads=100000", *folder], capsys)
    assert f"torch_threads=100000: expected auto or an integer in [0, {MAX_THREADS}]" in err


ISSUE_ULIMIT_V = 8_000_000 * 1024  # `ulimit -v 8000000`: bytes of address space


def _under_ulimit(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python args`` with 8 MB thread stacks (``ulimit -s 8192``) and ``ulimit -v 8000000``."""

    def limits() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_STACK)
        stack = 8 * 2**20 if hard == resource.RLIM_INFINITY else min(8 * 2**20, hard)
        resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = ISSUE_ULIMIT_V if hard == resource.RLIM_INFINITY else min(ISSUE_ULIMIT_V, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLTRANS_NO_PROGRESS": "1"}
    env.pop("OMP_STACKSIZE", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
        cwd=Path(__file__).resolve().parents[2], env=env, preexec_fn=limits, check=False,
    )  # fmt: skip


@pytest.mark.cli
@pytest.mark.parametrize("command", ["train", "evaluate", "collect", "load_policy"])
def test_the_documented_thread_maximum_is_refused_where_its_stacks_cannot_fit(
    command, cartpole_run, tmp_path
):
    """torch_threads=1024 under ``ulimit -v 8000000`` died of a MemoryError (or libgomp's
    abort): 2 x 1024 threads of 8 MB stacks are 16 GiB of address space."""
    args = {
        "train": ["-m", "rltrans.train", *TINY_PPO, f"run_dir={tmp_path / 'run'}"],
        "evaluate": ["-m", "rltrans.evaluate", f"checkpoint={cartpole_run}", "episodes=1"],
        "collect": ["-m", "rltrans.collect", f"policy={cartpole_run}", "episodes=1",
                    "dataset_id=rltrans/threads-v0"],
        "load_policy": ["-c", "import sys, rltrans\ntry:\n rltrans.load_policy(sys.argv[1], "
                        "torch_threads=1024)\nexcept rltrans.config.ConfigError as e:\n "
                        "print(f'error: {e}', file=sys.stderr); sys.exit(2)", str(cartpole_run)],
    }[command]  # fmt: skip
    if command != "load_policy":
        args.append("torch_threads=1024")
    done = _under_ulimit(*args)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.startswith("error: torch_threads=1024 needs at least 16.0 GiB"), done.stderr
    assert "ulimit -v 7.6 GiB" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_thread_stacks_count_only_against_a_limited_address_space(monkeypatch):
    from rltrans.config import resources

    monkeypatch.setattr(resources, "_stack_bytes", lambda: 8 * 2**20)
    # The guard leaves 6 GiB above what this process maps: 2 x 64 stacks fit, 2 x 1024 do not.
    assert resources.thread_problems(64) == []
    (problem,) = resources.thread_problems(MAX_THREADS)
    assert f"torch_threads={MAX_THREADS} needs at least 16.0 GiB" in problem
    assert resources.thread_problems("auto") == resources.thread_problems(0) == []
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))  # the guard puts its cap back
    if hard == resource.RLIM_INFINITY:  # no limit: the documented maximum fits
        assert resources.thread_problems(MAX_THREADS) == []


# ----------------------------------------------------------------------------- datasets


def test_a_datasets_wrapper_sizes_are_checked_before_anything_is_built(dataset, tmp_path, capsys):
    wrapper = {
        "name": "FrameStackObservation",
        "entry_point": "gymnasium.wrappers:FrameStackObservation",
        "kwargs": {"stack_size": 10**9},
    }
    edit_eval_spec(dataset, additional_wrappers=[wrapper])
    err = train_refused([*DT_TINY, "trust_env_code=true"], tmp_path, capsys)
    assert "stack_size=1000000000: expected integers of at most 1048576" in err


def test_a_configs_wrapper_sizes_are_checked(tmp_path, capsys):
    wrapper = "[{path: gymnasium.wrappers.FrameStackObservation, kwargs: {stack_size: 1000000000}}]"
    err = train_refused(["env=gym", f"env.wrappers={wrapper}"], tmp_path, capsys)
    assert "env.wrappers[0].kwargs.stack_size" in err


# ----------------------------------------------------------------------------- the estimate


def _total(args: list[str], **kwargs) -> float:
    return sum(b for b, _ in estimate(to_container(load_config(args)), **kwargs).values())


@pytest.mark.parametrize(
    ("base", "key", "small", "large"),
    [
        ([], "agent.dim", 32, 64),
        ([], "agent.layers", 1, 4),
        ([], "agent.memory", 32, 1024),
        ([], "env.num_envs", 16, 256),
        ([], "algo.num_steps", 128, 1024),
        (["agent.position=learned"], "+agent.max_len", 1024, 65536),
        (["agent.position=shaw"], "+agent.shaw_max_distance", 16, 4096),
        (["agent.long_memory=compressive"], "agent.compressed_slots", 32, 4096),
        (["env=autoencode"], "env.kwargs.length", 52, 65536),
        (["algo=impala", "runtime=process"], "runtime.slots", 8, 4096),
        (["algo=impala", "runtime=process"], "runtime.num_actors", 4, 64),
        (["agent=dt"], "algo.batch_size", 64, 1024),
    ],
)
def test_the_estimate_grows_with_each_key_it_names(base, key, small, large):
    low, high = _total([*base, f"{key}={small}"]), _total([*base, f"{key}={large}"])
    assert high > low, key


def test_the_spaces_and_acting_envs_size_an_evaluation():
    cfg = to_container(load_config([]))
    few = (gym.spaces.Box(0, 1, (4,)), gym.spaces.Discrete(2))
    many = (gym.spaces.Box(0, 1, (4,)), gym.spaces.Discrete(2**20))
    one = sum(b for b, _ in estimate(cfg, spaces=few, acting_envs=1).values())
    assert sum(b for b, _ in estimate(cfg, spaces=many, acting_envs=1).values()) > one
    assert sum(b for b, _ in estimate(cfg, spaces=few, acting_envs=4096).values()) > one
    assert resource_problems(cfg, total=2**40) == []
    assert "lower them" in resource_problems(cfg, total=2**20)[0]
