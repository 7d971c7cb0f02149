"""Several learner processes (torchrun): a step averaged over ranks is the one-process step over
all their rollouts, and the CLI under torchrun writes one run (checkpoints, one summary line)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rltrans import distributed
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import ImpalaLearner
from rltrans.run.checkpoint import load_checkpoint
from rltrans.runtime.pool import LocalPool
from rltrans.train import main as train_main
from tests.helpers.cli import summary_line
from tests.learners.test_impala import impala_settings
from tests.runtime.test_rollout import small_agent

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rollouts_and_learner(backbone: str):
    """Agent, learner and two rollouts (B = 2), the same in every process (fixed seeds)."""
    torch.manual_seed(0)
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    agent = small_agent(envs, backbone)
    pool = LocalPool([envs], agent, num_steps=16, segment_length=8, seed=0, device="cpu")
    pool.publish(None, 0)
    rollouts = [pool.get(), pool.get()]
    settings = impala_settings(lr=3e-3, max_grad_norm=0.5)
    learner = ImpalaLearner(agent, settings, total_updates=10)
    return agent, learner, rollouts


def two_updates(learner, buffers, values) -> list[float]:
    norms = []
    for _ in range(2):  # the second step also checks that the optimizer states agree
        norms.append(float(learner.update(buffers, values)["grad_norm"]))
    return norms


def join_as(rank: int, port: int) -> None:
    """Join a two-process gloo group as ``rank``, the way torchrun's environment says."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    distributed.init(distributed.World.from_env(), torch.device("cpu"))


def rank_main(rank: int, backbone: str, port: int, out: str) -> None:
    """One of two learner processes: train on its own half of the batch."""
    join_as(rank, port)
    agent, learner, rollouts = rollouts_and_learner(backbone)
    mine = rollouts[rank]
    norms = two_updates(learner, [mine.buffer], [mine.bootstrap_value])
    if rank == 0:
        torch.save({"model": agent.state_dict(), "norms": norms}, out)
    distributed.shutdown()


@pytest.mark.parametrize("backbone", ["mlp", "gtrxl"])
def test_averaged_step_over_two_half_batches_equals_one_step_over_the_whole(backbone, tmp_path):
    """Two gloo processes, each stepping on one of two rollouts with the gradient averaged,
    end with the weights (and gradient norms) of one process stepping on both rollouts."""
    agent, learner, rollouts = rollouts_and_learner(backbone)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    norms = two_updates(
        learner, [r.buffer for r in rollouts], [r.bootstrap_value for r in rollouts]
    )
    out = tmp_path / "rank0.pt"
    mp.spawn(rank_main, args=(backbone, free_port(), str(out)), nprocs=2, join=True)
    ranked = torch.load(out)
    assert ranked["norms"] == pytest.approx(norms, rel=1e-5)
    for key, value in agent.state_dict().items():
        torch.testing.assert_close(ranked["model"][key], value, rtol=1e-5, atol=1e-6)
    moved = max((agent.state_dict()[k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-4  # the comparison is of real steps, not of untouched weights


def release_main(rank: int, port: int, out: str) -> None:
    """One of two learner processes: join, load the compiler stack (as compile=auto does once
    the group exists), take part in a collective, leave; write whether the group outlived it."""
    join_as(rank, port)
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    group = weakref.ref(dist.group.WORLD)
    distributed.gather_objects(rank)
    distributed.shutdown()
    Path(f"{out}.{rank}").write_text("alive" if group() is not None else "freed")


def test_leaving_frees_the_group_even_with_the_compiler_stack_loaded(tmp_path):
    """shutdown() frees the process group, so gloo's worker threads are joined before the
    interpreter exits. A group left alive (torch.distributed.nn.functional binds group.WORLD
    as a default argument when imported after joining) dies during interpreter shutdown, and
    its threads' release of the last collective's tensors then aborts the process now and then."""
    out = tmp_path / "group"
    mp.spawn(release_main, args=(free_port(), str(out)), nprocs=2, join=True)
    assert [Path(f"{out}.{rank}").read_text() for rank in range(2)] == ["freed", "freed"]


def test_only_impala_runs_under_torchrun(monkeypatch, capsys):
    """PPO started by torchrun stops at once with a message naming the algorithms that can."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert train_main(["algo=ppo", "progress=false", "total_steps=64"]) == 2
    err = capsys.readouterr().err
    assert "WORLD_SIZE=2" in err and "algo=impala" in err


def torchrun(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "rltrans.train", *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_torchrun_trains_one_run_and_resumes(tmp_path):
    """torchrun with two learner processes: one summary line, steps counted over both ranks,
    checkpoints from rank 0 holding both ranks' reward scalers, and a resume that continues."""
    run_dir = tmp_path / "run"
    common = [
        "agent=mlp", "algo=impala", "env=gym", "env.id=CartPole-v1", "env.num_envs=2",
        "algo.num_steps=16", "algo.segment_length=8", "checkpoint_every=2",
        "progress=false", f"run_dir={run_dir}",
    ]  # fmt: skip
    done = torchrun([*common, "total_steps=256"])
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_line(done.stdout)
    assert summary["global_step"] == 256 and summary["updates"] == 4  # 4 x 2 ranks x 16 x 2
    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert len(payload["reward_scalers"]["by_rank"]) == 2
    assert payload["global_step"] == 256
    assert not (run_dir / "tb").exists() or len(list((run_dir / "tb").iterdir())) == 1

    more = torchrun(["resume=true", f"run_dir={run_dir}", "total_steps=512", "progress=false"])
    assert more.returncode == 0, more.stderr[-3000:]
    resumed = summary_line(more.stdout)
    assert resumed["global_step"] == 512 and resumed["updates"] == 8
