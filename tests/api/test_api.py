"""The Python API: rltrans.plan resolves a run once (the same plan as the command line's),
rltrans.learn trains it as the command line does, and callbacks see and can stop a run."""

import math

import pytest
from omegaconf import OmegaConf

import rltrans
from rltrans.api import _overrides, resolve
from rltrans.api.horizon import time_limit
from rltrans.config import ConfigError, load_config
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line

# Numbers a run prints that depend on time or place, not on what it learned.
VARYING = {"SPS", "run_dir", "checkpoint"}


def test_keywords_and_strings_resolve_to_the_same_plan():
    from_strings = rltrans.plan("agent=gru", "env=gym", "env.id=CartPole-v1", "algo.lr=0.001")
    from_keywords = rltrans.plan(
        agent="gru", env="gym", algo={"lr": 1e-3}, **{"env.id": "CartPole-v1"}
    )
    assert from_strings.to_dict() == from_keywords.to_dict()
    assert from_keywords.config.agent.backbone == "gru"
    assert from_keywords.trainer == "online"
    # The command it shows resolves to the same plan again.
    again = from_keywords.command.split()[3:]
    assert resolve(load_config(again), again).to_dict() == from_keywords.to_dict()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (3, 3),
        (1e-4, 1e-4),
        ("popgym:popgym-RepeatFirstEasy-v0", "popgym:popgym-RepeatFirstEasy-v0"),
        ("1e-3", "1e-3"),  # a string that reads as a number stays a string
        ("it's", "it's"),
    ],
)
def test_keyword_values_keep_their_type(value, expected):
    (override,) = _overrides("env.kwargs.x", value)  # what plan() hands the config
    cfg = load_config(["env=gym", override], validate=False)
    assert OmegaConf.select(cfg, "env.kwargs.x") == expected
    assert rltrans.plan(run_dir=None).config.run_dir is None


def test_the_plan_is_read_only_and_holds_the_horizon_fit():
    plan = rltrans.plan("env.kwargs.length=40")
    with pytest.raises(TypeError, match="read-only"):
        plan.config.seed = 3
    with pytest.raises(TypeError, match="read-only"):
        plan.config.env.num_envs = 3  # every section, all the way down
    with pytest.raises(TypeError):
        plan.config.env["kwargs"]["length"] = 3  # item assignment too
    assert not OmegaConf.is_config(plan.config)  # plain data, nothing to interpolate
    assert plan.to_dict() == plan.config and isinstance(plan.to_dict()["env"], dict)
    limit = time_limit(plan.config.env)  # the T-maze's
    assert plan.config.agent.horizon == limit and plan.config.agent.memory == limit
    assert plan.horizon_note.startswith(f"agent.horizon={limit} steps: agent.memory={limit}")


def test_bad_names_raise_config_errors_naming_them():
    with pytest.raises(ConfigError, match="agent.dimm"):
        rltrans.plan(**{"agent.dimm": 3})
    with pytest.raises(ConfigError, match="a config group takes an option's name"):
        rltrans.plan(agent=3)
    with pytest.raises(ConfigError, match="agent.compressed_slots=8 does nothing"):
        rltrans.plan(**{"agent.compressed_slots": 8})
    with pytest.raises(TypeError, match="takes a RunPlan"):
        rltrans.learn({"agent": "gtrxl"})


@pytest.mark.cli
def test_learn_trains_as_the_command_line_does(tmp_path, capsys):
    args = [*TINY_PPO, "total_steps=128", "seed=3"]
    assert train_main([*args, f"run_dir={tmp_path / 'cli'}"]) == 0
    cli = summary_line(capsys.readouterr().out)
    api = rltrans.learn(rltrans.plan(*args, run_dir=str(tmp_path / "api")))  # unrounded
    assert api["status"] == "finished"
    for key in set(cli) - VARYING:
        assert api[key] == cli[key] or math.isclose(api[key], cli[key], rel_tol=1e-5), key


def test_an_on_eval_callback_without_evaluations_is_refused_before_the_run(tmp_path):
    """PPO evaluates never by default (algo.eval_every=0): a callback that would never be
    called is refused with one line naming the knob, before any folder exists."""
    plan = rltrans.plan(*TINY_PPO, "total_steps=128", run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"algo\.eval_every=0 \(never\)") as err:
        rltrans.learn(plan, on_eval=lambda step, m: True)
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()
    rltrans.learn(plan, on_log=lambda step, m: None)  # on_log alone needs no evaluation


@pytest.mark.cli
def test_callbacks_see_every_update_and_stop_the_run(tmp_path):
    run_dir = tmp_path / "run"
    plan = rltrans.plan(
        *TINY_PPO,
        "total_steps=640",
        "algo.eval_every=2",
        "algo.eval_episodes=2",
        run_dir=str(run_dir),
    )
    logged, evaluated = [], []

    def on_eval(step, metrics):
        evaluated.append((step, metrics))
        return len(evaluated) < 2  # stop at the second evaluation

    summary = rltrans.learn(plan, on_log=lambda step, m: logged.append((step, m)), on_eval=on_eval)
    steps_per_update = 4 * 16
    assert summary["status"] == "stopped_early"
    assert summary["stop_reason"] == "on_eval returned False"
    assert summary["updates"] == 4 and summary["global_step"] == 4 * steps_per_update
    assert [step for step, _ in logged] == [steps_per_update * u for u in range(1, 5)]
    assert all("losses/policy" in m and "charts/SPS" in m for _, m in logged)
    assert [step for step, _ in evaluated] == [2 * steps_per_update, 4 * steps_per_update]
    assert all(set(m) >= {"eval/episodic_return", "eval/episodic_length"} for _, m in evaluated)
    assert summary["eval_return"] == evaluated[-1][1]["eval/episodic_return"]
    # Stopped as on SIGTERM: checkpointed where it stopped, and a resume finishes the run.
    resumed = rltrans.learn(rltrans.plan(resume=True, run_dir=str(run_dir)))
    assert resumed["status"] == "finished" and resumed["global_step"] == 640


def test_a_keyword_value_is_taken_literally_so_an_interpolation_in_it_is_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("RLTRANS_TEST_PLACE", str(tmp_path / "from-the-environment"))
    for options in (
        {"run_dir": "${oc.env:RLTRANS_TEST_PLACE}/x"},
        {"env": "gym", "env.id": "CartPole-v1", "env.kwargs": {"a": "${oc.env:HOME}"}},
        {"algo.eval_targets": [1.0, "${oc.env:RLTRANS_TEST_PLACE}"], "agent": "dt"},
    ):
        with pytest.raises(ConfigError, match=r"taken literally, never resolved") as err:
            rltrans.plan(**options)
        assert "from-the-environment" not in str(err.value)  # the variable was never read
    # An override string is a command line's: Hydra resolves it there, so it does here too.
    plan = rltrans.plan("run_dir=${oc.env:RLTRANS_TEST_PLACE}/x", total_steps=64)
    assert plan.config.run_dir == f"{tmp_path}/from-the-environment/x"
