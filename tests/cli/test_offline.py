"""Offline runtime end to end through the CLIs: collect -> train DT/BC -> evaluate -> load_policy;
resume equals an uninterrupted run; DQN Replay shards train; errors for missing data and spaces
that disagree; every target return is evaluated in one vector env."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rltrans import envs, load_policy
from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.policy import Policy
from rltrans.run.checkpoint import load_checkpoint
from rltrans.run.context import payload_spaces
from rltrans.runtime.evaluation import evaluate_targets
from rltrans.train import main as train_main
from rltrans.trainers import offline as offline_trainer
from rltrans.trainers.offline import derive_targets

LIMIT = 40  # CartPole step limit recorded in the test datasets (keeps evaluation short)
TINY = {
    "dt": ["agent.dim=16", "agent.layers=1", "agent.context=4"],
    "bc": ["agent.dim=16", "agent.layers=1", "agent.history=4"],
}
COMMON = ["algo.batch_size=8", "progress=false", "algo.log_every=2"]


def summary_line(out: str) -> dict:
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    assert len(lines) == 1, out
    return json.loads(lines[0])


@pytest.fixture(autouse=True)
def _minari_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


@pytest.fixture
def mixed(capsys) -> dict:
    """rltrans/cp-mixed-v0: the scripted controller's episodes plus random ones, via the CLI."""
    args = [
        "dataset_id=rltrans/cp-mixed-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "epsilon=[0,1]",
        "episodes=12",
        "num_envs=4",
        f"max_episode_steps={LIMIT}",
        "progress=false",
    ]
    assert collect_main(args) == 0
    return summary_line(capsys.readouterr().out)


def test_collect_random_and_mixture(mixed, capsys):
    args = ["dataset_id=rltrans/cp-random-v0", "env_id=CartPole-v1", "episodes=6"]
    assert collect_main([*args, "num_envs=3", "progress=false"]) == 0
    random = summary_line(capsys.readouterr().out)
    assert random["episodes"] == 6 and random["policy"] == "uniform random"
    assert random["max_return"] < LIMIT  # random CartPole falls within a few dozen steps
    # The controller's half always reaches the limit, the epsilon=1 half does not.
    assert mixed["episodes"] == 12 and mixed["max_return"] == LIMIT
    assert mixed["min_return"] < LIMIT / 2 and mixed["epsilon"] == [0.0, 1.0]
    assert collect_main(args) == 2  # exists already
    assert "overwrite=true" in capsys.readouterr().err


@pytest.mark.parametrize("agent", ["dt", "bc"])
def test_train_evaluate_and_load_policy(agent, mixed, tmp_path, capsys):
    run = tmp_path / "run"
    args = [f"agent={agent}", "dataset=rltrans/cp-mixed-v0", *TINY[agent], *COMMON]
    extra = ["train_steps=4", "algo.eval_episodes=1", "algo.eval_targets=[10,40]"]
    assert train_main([*args, *extra, f"run_dir={run}"]) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["train_steps"] == 4
    assert set(summary["return_by_target"]) == {"10", "40"}
    assert summary["dataset"]["id"] == "rltrans/cp-mixed-v0"
    assert summary["dataset"]["max_return"] == LIMIT

    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == 4 and payload["eval_targets"] == [10.0, 40.0]
    assert payload["config"]["env"]["kind"] == "dataset"  # the config keeps what was asked
    env = payload["eval_env"]  # the dataset's env, resolved for evaluate to rebuild
    assert env["kind"] == "gym" and env["id"] == "CartPole-v1"
    assert env["kwargs"]["max_episode_steps"] == LIMIT
    assert payload["agent_kwargs"]["stats"]["return_scale"] == LIMIT

    tags = _tensorboard_tags(run)
    assert {"eval/return_target_10", "eval/return_target_40", "eval/return_mean"} <= tags
    assert "losses/action" in tags

    assert evaluate_main([f"checkpoint={run}", "target_return=[5,25]", "episodes=2"]) == 0
    result = summary_line(capsys.readouterr().out)
    assert result["num_envs"] == 4 and result["episodes"] == 4
    assert [t["target"] for t in result["per_target"]] == [5.0, 25.0]
    assert all(t["episodes"] == 2 for t in result["per_target"])
    assert all(0 < t["mean_return"] <= LIMIT for t in result["per_target"])

    policy = load_policy(run)
    assert isinstance(policy, Policy) and policy.return_conditioned
    assert policy.target_return == 40.0
    state = policy.initial_state(2, target_return=30.0)
    obs = np.zeros((2, 4), dtype=np.float32)
    action, state = policy.act(obs, state, np.ones(2, dtype=bool))
    assert isinstance(action, np.ndarray) and action.shape == (2,)
    action, state = policy.act(obs, state, np.zeros(2, dtype=bool), reward=np.ones(2))
    assert state.returns_to_go[:, -2:].tolist() == [[30.0, 29.0], [30.0, 29.0]]

    # The saved policy writes a dataset itself, in its training env by default.
    assert collect_main([f"dataset_id=rltrans/cp-{agent}-v0", f"policy={run}", "episodes=2"]) == 0
    collected = summary_line(capsys.readouterr().out)
    assert collected["env_id"] == "CartPole-v1" and collected["episodes"] == 2


def test_offline_compile_true_and_auto(mixed, tmp_path, capsys):
    """compile=true trains the DT through the compiled loss; compile=auto (the default) stays
    eager in a run too short to pay for it and says so."""
    args = ["agent=dt", "dataset=rltrans/cp-mixed-v0", *TINY["dt"], *COMMON, "train_steps=4"]
    assert train_main([*args, "compile=true", f"run_dir={tmp_path / 'true'}"]) == 0
    assert summary_line(capsys.readouterr().out)["status"] == "finished"
    assert train_main([*args, f"run_dir={tmp_path / 'auto'}"]) == 0
    assert "compile=auto: staying eager (0 updates left" in capsys.readouterr().err
    payload = load_checkpoint(tmp_path / "auto" / "checkpoints" / "last.pt")
    assert payload["compile"] == "eager"


def _tensorboard_tags(run) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_resume_equals_an_uninterrupted_run(mixed, tmp_path, capsys):
    args = ["agent=dt", "dataset=rltrans/cp-mixed-v0", *TINY["dt"], *COMMON]
    args += ["algo.eval_episodes=0", "tensorboard=false"]
    assert train_main([*args, "train_steps=6", f"run_dir={tmp_path / 'a'}"]) == 0
    assert train_main([*args, "train_steps=3", f"run_dir={tmp_path / 'b'}"]) == 0
    resume = [*args, "train_steps=6", f"run_dir={tmp_path / 'b'}", "resume=true"]
    assert train_main(resume) == 0
    assert summary_line(capsys.readouterr().out.splitlines()[-1])["train_steps"] == 6
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert b["global_step"] == 6
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, rtol=0, atol=0, msg=name)


def test_every_target_in_one_vector_env(mixed, tmp_path, monkeypatch, capsys):
    calls = []
    real = envs.make_env

    def counting(cfg, **kwargs):
        calls.append(dict(cfg))
        return real(cfg, **kwargs)

    monkeypatch.setattr(offline_trainer, "make_env", counting)
    args = ["agent=dt", "dataset=rltrans/cp-mixed-v0", *TINY["dt"], *COMMON, "train_steps=4"]
    args += ["algo.eval_every=2", "algo.eval_episodes=3", "algo.eval_targets=[10,20]"]
    run = tmp_path / "run"  # tmp_path holds the dataset: not a folder a run may take
    assert train_main([*args, f"run_dir={run}", "tensorboard=false"]) == 0
    assert len(calls) == 1 and calls[0]["num_envs"] == 6  # 2 targets x 3 episodes, 2 evaluations
    assert summary_line(capsys.readouterr().out)["eval_episodes_per_target"] == 3

    # Env i is conditioned on targets[i // episodes], and each target gets its episodes.
    model = load_policy(run).agent
    seen = []
    initial_state = model.initial_state
    monkeypatch.setattr(model, "initial_state", lambda n, t: seen.append(t) or initial_state(n, t))
    vec = real({**calls[0], "num_envs": 6}, seed=0, training=False)
    results = evaluate_targets(model, vec, [10.0, 20.0], 3, seed=0, device="cpu")
    vec.close()
    assert seen[0].tolist() == [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]
    assert [len(r.returns) for r in results] == [3, 3]


def test_missing_dataset_and_space_mismatch_errors(mixed, tmp_path, capsys):
    base = ["agent=dt", *TINY["dt"], *COMMON, "train_steps=2", f"run_dir={tmp_path / 'r'}"]
    assert train_main([*base, "dataset=rltrans/nowhere-v0"]) == 2
    err = capsys.readouterr().err
    assert "'rltrans/nowhere-v0' is not local" in err and "rltrans/cp-mixed-v0" in err
    assert "python -m rltrans.collect" in err
    assert train_main(base) == 2
    assert "needs dataset=" in capsys.readouterr().err

    # Evaluating in an env whose spaces differ from the dataset's fails before training.
    assert train_main([*base, "dataset=rltrans/cp-mixed-v0", "env=gym", "env.id=Pendulum-v1"]) == 2
    err = capsys.readouterr().err
    assert "observation space" in err and "(4,)" in err and "(3,)" in err
    assert train_main([*base, "dataset=rltrans/cp-mixed-v0", "algo.eval_episodes=0"]) == 0
    capsys.readouterr()
    checkpoint = f"checkpoint={tmp_path / 'r'}"
    assert evaluate_main([checkpoint, "env_id=Pendulum-v1", "target_return=10"]) == 2
    assert "observation space" in capsys.readouterr().err
    args = ["dataset_id=rltrans/x-v0", f"policy={tmp_path / 'r'}", "env_id=Pendulum-v1"]
    assert collect_main(args) == 2
    assert "choose an env_id with the same spaces" in capsys.readouterr().err


def test_collect_refuses_torch_native_checkpoints(tmp_path, capsys):
    tiny = ["env.num_envs=2", "algo.num_steps=8", "algo.segment_length=4", "algo.num_minibatches=1"]
    tiny += ["agent.dim=8", "agent.layers=1", "agent.heads=1", "agent.memory=4", "progress=false"]
    tiny += ["agent.long_memory=none"]  # mixed needs two heads
    assert train_main([*tiny, "total_steps=16", f"run_dir={tmp_path}", "tensorboard=false"]) == 0
    capsys.readouterr()
    assert collect_main(["dataset_id=rltrans/tmaze-v0", f"policy={tmp_path}"]) == 2
    assert "torch-native" in capsys.readouterr().err


def test_dqn_replay_shards_train_a_cnn_decision_transformer(tmp_path, capsys):
    from rltrans.envs.dqn_replay import write_dqn_replay_shard

    rng = np.random.default_rng(0)
    rows = 40  # two terminated episodes of 20 frames
    terminals = np.zeros(rows, np.uint8)
    terminals[[19, 39]] = 1
    actions = rng.integers(0, 6, rows).astype(np.int32)
    actions[0] = 5  # Pong's 6 actions all occur, so the data's space is Discrete(6)
    write_dqn_replay_shard(
        tmp_path / "dqn",
        "Pong",
        run=1,  # pong-mixed-v0 = run 1, checkpoint 1
        epoch=1,
        observations=rng.integers(1, 256, (rows, 84, 84), dtype=np.uint8),
        actions=actions,
        rewards=rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), rows),
        terminals=terminals,
    )
    args = ["agent=dt", "dataset=pong-mixed-v0", "agent.dim=16", "agent.layers=1"]
    args += ["agent.context=3", "algo.batch_size=2", "train_steps=2", "algo.eval_episodes=0"]
    args += [f"algo.dqn_replay.root={tmp_path / 'dqn'}", "algo.dqn_replay.check_size=false"]
    assert train_main([*args, "progress=false", f"run_dir={tmp_path / 'run'}"]) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["dataset"]["kind"] == "dqn_replay" and summary["dataset"]["episodes"] == 2
    assert summary["loss"] is not None and np.isfinite(summary["loss"])
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert payload_spaces(payload)[0].shape == (4, 84, 84)
    env = payload["eval_env"]  # evaluation env: no sticky actions, stacked like the data
    assert env["id"] == "ALE/Pong-v5" and env["kwargs"]["repeat_action_probability"] == 0.0
    assert env["wrappers"][-1]["kwargs"] == {"stack_size": 4, "padding_type": "zero"}


def test_derived_targets_are_evenly_spaced_up_to_the_best_return():
    assert derive_targets(np.array([10.0, 20.0, 500.0]), 3) == [173.33, 336.67, 500.0]
    assert derive_targets(np.array([7.0, 7.0]), 4) == [7.0]


def test_reference_scores_give_d4rls_normalised_score(tmp_path, capsys):
    args = ["dataset_id=rltrans/cp-ref-v0", "env_id=CartPole-v1", "episodes=4", "progress=false"]
    args += [f"max_episode_steps={LIMIT}"]
    assert collect_main([*args, "ref_min_score=10"]) == 2
    assert "ref_min_score=10.0 and ref_max_score=None: give both" in capsys.readouterr().err
    assert collect_main([*args, "ref_min_score=20", "ref_max_score=10"]) == 2
    assert "the first below the second" in capsys.readouterr().err
    assert collect_main([*args, "ref_min_score=10", "ref_max_score=30"]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    train = ["agent=bc", "dataset=rltrans/cp-ref-v0", *TINY["bc"], *COMMON, f"run_dir={run}"]
    train += ["train_steps=2", "algo.eval_episodes=2", "algo.eval_targets=[40]"]
    assert train_main(train) == 0
    summary = summary_line(capsys.readouterr().out)
    assert (summary["dataset"]["ref_min_score"], summary["dataset"]["ref_max_score"]) == (10, 30)
    score = 100 * (summary["return_by_target"]["40"] - 10) / 20
    assert summary["normalized_score_by_target"] == {"40": pytest.approx(score, abs=0.005)}
    assert evaluate_main([f"checkpoint={run}", "episodes=2", "progress=false"]) == 0
    result = summary_line(capsys.readouterr().out)
    score = 100 * (result["return_by_target"]["40"] - 10) / 20
    assert result["normalized_score_by_target"] == {"40": pytest.approx(score, abs=0.005)}
    # Data without reference scores reports none.
    assert collect_main([*args[1:], "dataset_id=rltrans/cp-plain-v0"]) == 0
    capsys.readouterr()
    train[1] = "dataset=rltrans/cp-plain-v0"
    assert train_main([*train, "overwrite=true"]) == 0
    assert "normalized_score_by_target" not in summary_line(capsys.readouterr().out)
