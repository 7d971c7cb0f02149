"""agent.horizon: memory, long memory and training segments fitted to the task's length."""

import pytest
import yaml

from rltrans import evaluate, train
from rltrans.config import load_config
from rltrans.run import override_keys
from rltrans.trainers.horizon import (
    MANY_ANSWERS_ENT_COEF,
    MYOPIC_GAMMA,
    fit_horizon,
    spanning_segment,
)


@pytest.mark.parametrize(
    ("distance", "num_steps", "segment"),
    [(22, 128, 32), (202, 128, 128), (16, 128, 16), (3, 128, 4), (100, 96, 96), (7, 12, 12)],
)
def test_spanning_segment_is_the_shortest_divisor_that_spans(distance, num_steps, segment):
    assert spanning_segment(distance, num_steps) == segment
    assert num_steps % segment == 0


def fitted(*overrides):
    return fit_horizon(load_config(list(overrides), "train"), override_keys(overrides))


def test_auto_fits_the_tmaze_corridor_and_goes_delta_beyond_the_window_cap():
    cfg = fitted("env.kwargs.length=100")  # time limit 2 x (100 + 1)
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.agent.long_memory) == (202, 202, "none")
    assert cfg.algo.segment_length == 128
    cfg = fitted("env.kwargs.length=300")  # beyond the cap: the window stays, delta beyond it
    assert (cfg.agent.memory, cfg.agent.long_memory) == (32, "delta")
    # a rollout of 5 x 128 steps spans the 602 steps, as one segment run in chunks of 64
    assert (cfg.algo.num_steps, cfg.algo.segment_length, cfg.agent.chunk) == (640, 640, 64)
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (pytest.approx(1 - 1 / 602), 0.05)
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=1000", "agent.chunk=32")
    assert (cfg.algo.num_steps, cfg.algo.segment_length, cfg.agent.chunk) == (1024, 1024, 32)
    cfg = fitted("env.kwargs.length=300", "agent.long_memory=linear", "algo.gamma=0.9999")
    assert (cfg.agent.long_memory, cfg.algo.gamma) == ("linear", 0.9999)  # nothing lowered
    cfg = fitted("env.kwargs.length=100")
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (0.99, 0.01)  # within the cap: as configured
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=8")  # short: defaults stay
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (9, 32, 16)


def test_the_decision_settings_follow_only_tasks_of_one_decision():
    """The T-mazes say one_decision: gamma and the entropy floor rise with the distance;
    repeat-first answers at every step and keeps PPO's entropy beyond the cap (its discount is
    a myopic task's)."""
    cfg = fitted("env=repeat_first", "env.kwargs.length=415")
    assert (cfg.agent.long_memory, cfg.algo.num_steps, cfg.agent.chunk) == ("delta", 512, 64)
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (MYOPIC_GAMMA, 0.01)
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=1000")
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (pytest.approx(1 - 1 / 1001), 0.05)
    cfg = fitted("env=gym", "env.id=CartPole-v1", "agent.horizon=400")  # says nothing: decision
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (pytest.approx(1 - 1 / 400), 0.05)
    given = fitted("env=passive_tmaze", "env.kwargs.length=1000", "algo.ent_coef=0.01")
    assert (given.algo.gamma, given.algo.ent_coef) == (pytest.approx(1 - 1 / 1001), 0.01)
    given = fitted("env=passive_tmaze", "env.kwargs.length=1000", "algo.gamma=0.99")
    assert (given.algo.gamma, given.algo.ent_coef) == (0.99, 0.05)  # on the command line: kept


def test_aggregate_tasks_get_the_additive_memory_beside_the_window():
    """count-recall says aggregate: within the cap the window spans it and the additive
    (counting) memory joins it, beyond the cap too; a lookup task (repeat-first) at the same
    distance keeps the window alone, and beyond the cap gets delta."""
    cfg = fitted("env=count_recall", "env.kwargs.length=103", "env.kwargs.num_symbols=4")
    assert (cfg.agent.memory, cfg.agent.long_memory, cfg.algo.segment_length) == (
        103,
        "additive",
        128,
    )
    assert (cfg.algo.num_steps, cfg.agent.chunk) == (128, None)  # as within the cap
    assert fitted("env=repeat_first", "env.kwargs.length=103").agent.long_memory == "none"
    assert fitted("env=count_recall", "env.kwargs.length=400").agent.long_memory == "additive"
    assert fitted("env=repeat_first", "env.kwargs.length=400").agent.long_memory == "delta"
    cfg = fitted("env=count_recall", "agent.long_memory=compressive")  # a chosen one stays
    assert cfg.agent.long_memory == "compressive"
    assert fitted("agent=gru", "env=count_recall").agent.get("long_memory") is None
    assert fitted("env=count_recall", "agent.horizon=null").agent.long_memory == "none"
    # none on the command line is a choice too: the window alone, still fitted to the task
    cfg = fitted("env=count_recall", "env.kwargs.length=103", "agent.long_memory=none")
    assert (cfg.agent.long_memory, cfg.agent.memory) == ("none", 103)
    cfg = fitted("env=repeat_first", "env.kwargs.length=400", "agent.long_memory=none")
    assert (cfg.agent.long_memory, cfg.algo.num_steps, cfg.agent.chunk) == ("none", 512, 64)


@pytest.mark.parametrize("agent", ["gtrxl", "gru"])
def test_myopic_tasks_get_a_low_discount_unless_one_is_given(agent):
    """Where no answer changes what comes later, every discount has the same best policy and
    a low one keeps the later answers' rewards out of each advantage."""
    for env in ("count_recall", "repeat_first", "autoencode", "repeat_previous"):
        assert fitted(f"agent={agent}", f"env={env}").algo.gamma == MYOPIC_GAMMA
    assert fitted(f"agent={agent}", "env=count_recall", "algo.gamma=0.9").algo.gamma == 0.9
    assert fitted(f"agent={agent}", "env=count_recall", "algo=impala").algo.gamma == MYOPIC_GAMMA
    assert fitted(f"agent={agent}", "env=tmaze").algo.gamma == 0.99  # actions steer
    assert fitted(f"agent={agent}", "env=count_recall", "agent.horizon=null").algo.gamma == 0.99
    assert set(override_keys(["algo.gamma=0.5", "+x.y=1", "agent=gru", "--cfg"])) == {
        "algo.gamma",
        "x.y",
        "agent",
    }


@pytest.mark.parametrize("agent", ["gtrxl", "gru"])
def test_myopic_tasks_with_many_answers_get_a_larger_entropy_bonus(agent):
    """count-recall answers with 27 (Hard: 17) counts, the high ones rare: the entropy bonus
    rises so PPO tries them before its policy settles; the 4-symbol tasks keep PPO's."""
    for length, symbols in ((51, 2), (103, 4), (207, 13)):  # POPGym's Easy, Medium, Hard
        kwargs = (f"env.kwargs.length={length}", f"env.kwargs.num_symbols={symbols}")
        cfg = fitted(f"agent={agent}", "env=count_recall", *kwargs)
        assert cfg.algo.ent_coef == MANY_ANSWERS_ENT_COEF
    for env in ("repeat_first", "autoencode", "repeat_previous", "tmaze"):
        assert fitted(f"agent={agent}", f"env={env}").algo.ent_coef == 0.01
    given = fitted(f"agent={agent}", "env=count_recall", "algo.ent_coef=0.01")
    assert given.algo.ent_coef == 0.01  # on the command line: kept
    assert fitted(f"agent={agent}", "env=count_recall", "algo.ent_coef=0.1").algo.ent_coef == 0.1
    assert fitted(f"agent={agent}", "env=count_recall", "agent.horizon=null").algo.ent_coef == 0.01
    impala = fitted(f"agent={agent}", "env=count_recall", "algo=impala")
    assert impala.algo.ent_coef == MANY_ANSWERS_ENT_COEF


def test_nothing_is_lowered_and_explicit_or_null_horizons_are_honoured():
    cfg = fitted("env.kwargs.length=100", "agent.memory=300", "algo.segment_length=128")
    assert (cfg.agent.memory, cfg.algo.segment_length) == (300, 128)
    cfg = fitted("agent.horizon=50")
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (50, 50, 64)
    plain = load_config(["env.kwargs.length=100", "agent.horizon=null"], "train")
    cfg = fitted("env.kwargs.length=100", "agent.horizon=null")
    assert cfg == plain


def test_recurrent_agents_get_segments_and_the_memoryless_nothing():
    cfg = fitted("agent=gru", "env=repeat_first", "env.kwargs.length=64")
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (64, 0, 64)
    mlp = load_config(["agent=mlp", "env.kwargs.length=100"], "train")
    assert fitted("agent=mlp", "env.kwargs.length=100") == mlp


def test_auto_changes_nothing_where_the_env_names_no_memory_distance():
    for env in ("env=stateless_cartpole", "env=minigrid_memory"):
        cfg = fitted(env)
        assert cfg.agent.horizon is None
        assert (cfg.agent.memory, cfg.algo.segment_length) == (32, 16)


def test_segments_stay_enough_for_the_minibatches():
    cfg = fitted("env.kwargs.length=100", "env.num_envs=2", "algo.num_minibatches=4")
    assert cfg.algo.segment_length == 64  # 2 envs x 128 steps / 64 = 4 segments


def test_fitting_twice_is_fitting_once():
    once = fitted("env.kwargs.length=300")
    assert fit_horizon(once.copy()) == once


def test_a_run_saves_the_fitted_agent_and_resumes_and_evaluates_it(tmp_path, capsys):
    run = tmp_path / "run"
    common = ["env.num_envs=4", "algo.num_steps=64", "algo.num_minibatches=2"]
    common += ["progress=false", "torch_threads=1"]
    assert train.main(["env.kwargs.length=40", "total_steps=128", f"run_dir={run}", *common]) == 0
    err = capsys.readouterr().err
    note = "agent.horizon=82 steps: agent.memory=82, agent.long_memory=none, algo.segment_length=64"
    assert note in err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["agent"]["horizon"], saved["agent"]["memory"]) == (82, 82)
    assert saved["algo"]["segment_length"] == 64
    resume = ["resume=true", f"run_dir={run}", "total_steps=256", "progress=false"]
    assert train.main(resume) == 0
    assert "agent.horizon" not in capsys.readouterr().err  # said once, when the run started
    again = ["env.kwargs.length=40", "total_steps=384", f"run_dir={run}", "resume=true", *common]
    assert train.main(again) == 0  # the first command repeated: it compares equal
    assert evaluate.main([f"checkpoint={run}", "episodes=2", "progress=false"]) == 0


def test_bad_horizons_are_refused_with_the_valid_ones(capsys):
    for value in ("0", "soon"):
        assert train.main([f"agent.horizon={value}", "--cfg"]) == 2
        assert "agent.horizon" in capsys.readouterr().err


def test_the_slowest_retention_reaches_four_times_the_distance_where_the_default_falls_short():
    """A linear/delta/additive memory's slowest head starts at 4 D steps where the default's
    (8192 with 4 heads) is shorter: the passive T-maze 10,000 only; 1,000 and every measured
    task keep the default; a given scale, or a memory without retention, is left alone."""
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=10000")
    assert (cfg.agent.long_memory, cfg.agent.retention_scale) == ("delta", 40_004)
    for short in (["env=passive_tmaze", "env.kwargs.length=1000"], ["env.kwargs.length=300"]):
        assert fitted(*short).agent.retention_scale is None
    assert (
        fitted("env=passive_tmaze", "env.kwargs.length=3000", "agent.heads=2").agent.get(
            "retention_scale"
        )
        == 12_004
    )  # two heads: the default's slowest is 128 steps
    given = fitted("env=passive_tmaze", "env.kwargs.length=10000", "agent.retention_scale=500")
    assert given.agent.retention_scale == 500
    long = ("env=passive_tmaze", "env.kwargs.length=10000")
    assert fitted(*long, "agent.long_memory=compressive").agent.retention_scale is None
    assert fitted(*long, "agent.long_memory=none").agent.retention_scale is None
    assert fitted("agent=gru", *long).agent.get("retention_scale") is None
    once = fitted(*long)
    assert fit_horizon(once.copy()) == once
