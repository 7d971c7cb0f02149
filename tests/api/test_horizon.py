"""agent.horizon: memory, long memory and training segments fitted to the task's length."""

import pytest
import yaml

from rltrans import evaluate, train
from rltrans.api import horizon
from rltrans.api.horizon import fit_horizon, observed_length, spanning_segment
from rltrans.api.resume import override_keys
from rltrans.config import load_config
from tests.helpers.user_envs import EPISODES_ID


@pytest.mark.parametrize(
    ("distance", "num_steps", "segment"),
    [(22, 128, 32), (202, 128, 128), (16, 128, 16), (3, 128, 4), (100, 96, 96), (7, 12, 12)],
)
def test_spanning_segment_is_the_shortest_divisor_that_spans(distance, num_steps, segment):
    assert spanning_segment(distance, num_steps) == segment
    assert num_steps % segment == 0


def fitted(*overrides):
    return fit_horizon(load_config(list(overrides), "train"), override_keys(overrides))


def test_auto_fits_the_tmaze_corridor_and_spans_the_rollout_beyond_the_window_cap():
    cfg = fitted("env.kwargs.length=100")  # time limit 2 x (100 + 1)
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.agent.long_memory) == (202, 202, "mixed")
    assert cfg.algo.segment_length == 128
    cfg = fitted("env.kwargs.length=300")  # beyond the cap: the window stays, the long memory
    assert (cfg.agent.memory, cfg.agent.long_memory) == (32, "mixed")
    # a rollout of 5 x 128 steps spans the 602 steps, as one segment run in chunks of 64
    assert (cfg.algo.num_steps, cfg.algo.segment_length, cfg.agent.chunk) == (640, 640, 64)
    assert (cfg.algo.gamma, cfg.algo.ent_coef) == (0.9, 0.03)  # the agent's, at every distance
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=1000", "agent.chunk=32")
    assert (cfg.algo.num_steps, cfg.algo.segment_length, cfg.agent.chunk) == (1024, 1024, 32)
    cfg = fitted("env.kwargs.length=300", "agent.long_memory=linear", "algo.gamma=0.9999")
    assert (cfg.agent.long_memory, cfg.algo.gamma) == ("linear", 0.9999)  # given: kept
    cfg = fitted("env.kwargs.length=100", "agent.memory=8", "algo.segment_length=32")
    assert (cfg.agent.memory, cfg.algo.segment_length) == (8, 32)  # given: kept, not raised
    cfg = fitted("env.kwargs.length=300", "algo.num_steps=256", "algo.segment_length=64")
    assert (cfg.algo.num_steps, cfg.algo.segment_length) == (256, 64)
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=8")  # short: defaults stay
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (9, 32, 128)
    cfg = fitted("agent=trxl", "env.kwargs.length=300")  # none configured: mixed beyond the cap
    assert (cfg.agent.long_memory, cfg.agent.chunk) == ("mixed", 64)


def test_every_task_at_one_distance_gets_the_same_settings():
    """Nothing of what a task is changes what auto fits: a task answered at every step, a
    count and one decision after a corridor, at one distance, get one config (the envs'
    own settings aside), with the agent's own discount and entropy bonus."""
    tasks = (
        ("env=repeat_first", "env.kwargs.length=415"),
        ("env=count_recall", "env.kwargs.length=415"),
        ("env=passive_tmaze", "env.kwargs.length=414"),
        ("env=gym", "env.id=CartPole-v1", "agent.horizon=415"),
    )
    configs = [fitted(*task) for task in tasks]
    for cfg in configs:
        assert (cfg.agent.horizon, cfg.agent.long_memory, cfg.agent.chunk) == (415, "mixed", 64)
        assert (cfg.algo.num_steps, cfg.algo.segment_length) == (512, 512)
        assert (cfg.algo.gamma, cfg.algo.ent_coef) == (0.9, 0.03)
    plain = [{k: v for k, v in cfg.items() if k != "env"} for cfg in configs]
    assert all(p == plain[0] for p in plain[1:])
    for agent in ("gtrxl", "gru"):
        within = [fitted(f"agent={agent}", task[0], "env.kwargs.length=103") for task in tasks[:2]]
        assert within[0].agent == within[1].agent and within[0].algo == within[1].algo
    given = fitted("env=passive_tmaze", "env.kwargs.length=1000", "algo.gamma=0.99")
    assert given.algo.gamma == 0.99  # on the command line: kept


def test_a_long_memory_on_the_command_line_stays_none_too():
    cfg = fitted("env=count_recall", "agent.long_memory=compressive")
    assert cfg.agent.long_memory == "compressive"
    assert fitted("agent=gru", "env=count_recall").agent.get("long_memory") is None
    cfg = fitted("env=repeat_first", "env.kwargs.length=400", "agent.long_memory=none")
    assert (cfg.agent.long_memory, cfg.algo.num_steps, cfg.agent.chunk) == ("none", 512, 64)
    assert set(override_keys(["algo.gamma=0.5", "+x.y=1", "agent=gru", "--cfg"])) == {
        "algo.gamma",
        "x.y",
        "agent",
    }


def test_nothing_is_lowered_and_explicit_or_null_horizons_are_honoured():
    cfg = fitted("env.kwargs.length=100", "agent.memory=300", "algo.segment_length=128")
    assert (cfg.agent.memory, cfg.algo.segment_length) == (300, 128)
    cfg = fitted("agent.horizon=50", "algo=ppo")  # PPO's own segments of 16 rise to span it
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (50, 50, 64)
    plain = load_config(["env.kwargs.length=100", "agent.horizon=null"], "train")
    cfg = fitted("env.kwargs.length=100", "agent.horizon=null")
    assert cfg == plain


def test_recurrent_agents_get_segments_and_the_memoryless_nothing():
    cfg = fitted("agent=gru", "env=repeat_first", "env.kwargs.length=64", "algo=ppo")
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (64, 0, 64)
    mlp = load_config(["agent=mlp", "env.kwargs.length=100"], "train")
    assert fitted("agent=mlp", "env.kwargs.length=100") == mlp


def test_auto_changes_nothing_where_no_time_limit_is_known_before_the_run():
    cfg = fitted("env=gym")  # CartPole-v1, whose episodes vary
    assert cfg.agent.horizon is None
    assert (cfg.agent.memory, cfg.algo.segment_length) == (32, 128)
    assert fitted("env=stateless_cartpole").agent.horizon == 500  # its time limit


def test_auto_changes_nothing_on_minigrid_whose_time_limit_comes_with_the_env():
    pytest.importorskip("minigrid", reason='env=minigrid_memory needs: pip install ".[minigrid]"')
    cfg = fitted("env=minigrid_memory")
    assert cfg.agent.horizon is None
    assert (cfg.agent.memory, cfg.algo.segment_length) == (32, 128)


EPISODES = ("env=gym", f"env.id={EPISODES_ID}")


def test_auto_observes_the_fixed_length_of_a_gymnasium_envs_episodes():
    """A user's env that names no time limit but whose every episode lasts L steps is fitted
    as a torch task of time limit L would be; one whose episodes vary, or never end, is not."""
    cfg = fitted(*EPISODES, "env.kwargs.length=100")
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.algo.segment_length) == (100, 100, 128)
    cfg = fitted(*EPISODES, "env.kwargs.length=415")  # beyond the window: rollouts span it
    assert (cfg.agent.horizon, cfg.agent.memory, cfg.agent.long_memory) == (415, 32, "mixed")
    assert (cfg.algo.num_steps, cfg.algo.segment_length, cfg.agent.chunk) == (512, 512, 64)
    twin = fitted("env=repeat_first", "agent.horizon=415")
    assert {k: v for k, v in cfg.items() if k != "env"} == {
        k: v for k, v in twin.items() if k != "env"
    }
    assert fitted(*EPISODES).agent.horizon is None  # lengths that vary with the actions
    assert fitted(*EPISODES, "env.kwargs.length=100", "agent.horizon=null").agent.memory == 32
    assert fitted(*EPISODES, "env.kwargs.length=100", "agent=gru").algo.num_steps == 128


def test_the_probe_gives_up_on_episodes_longer_than_its_reach(monkeypatch):
    env = load_config([*EPISODES, "env.kwargs.length=-1"], "train").env
    monkeypatch.setattr(horizon, "PROBE_STEPS", 50)
    assert observed_length(env, seed=1) is None  # never ends: stops after 50 steps
    env = load_config([*EPISODES, "env.kwargs.length=51"], "train").env
    assert observed_length(env, seed=1) is None  # longer than the probe reaches
    env = load_config([*EPISODES, "env.kwargs.length=50"], "train").env
    assert observed_length(env, seed=1) == 50


def test_segments_stay_enough_for_the_minibatches():
    cfg = fitted("env.kwargs.length=100", "env.num_envs=2", "algo.num_minibatches=4")
    assert cfg.algo.segment_length == 64  # 2 envs x 128 steps / 64 = 4 segments


def test_fitting_twice_is_fitting_once():
    once = fitted("env.kwargs.length=300")
    assert fit_horizon(once.copy()) == once


@pytest.mark.cli
def test_a_run_saves_the_fitted_agent_and_resumes_and_evaluates_it(tmp_path, capsys):
    run = tmp_path / "run"
    common = ["env.num_envs=4", "algo.num_steps=64", "algo.num_minibatches=2"]
    common += ["progress=false", "torch_threads=1"]
    assert train.main(["env.kwargs.length=40", "total_steps=128", f"run_dir={run}", *common]) == 0
    err = capsys.readouterr().err
    note = "agent.horizon=82 steps: agent.memory=82, agent.long_memory=mixed, "
    note += "algo.segment_length=64"
    assert note in err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["agent"]["horizon"], saved["agent"]["memory"]) == (82, 82)
    assert saved["algo"]["segment_length"] == 64
    resume = ["resume=true", f"run_dir={run}", "total_steps=256", "progress=false"]
    assert train.main(resume) == 0
    assert "agent.horizon" not in capsys.readouterr().err  # said once, when the run started
    again = ["env.kwargs.length=40", "total_steps=384", f"run_dir={run}", "resume=true", *common]
    assert train.main(again) == 0  # the first command repeated: it compares equal
    err = capsys.readouterr().err  # where it continues: 384 steps are two updates of 256
    assert f"resuming {run} at step 256 of 512 (" in err
    assert evaluate.main([f"checkpoint={run}", "episodes=2", "progress=false"]) == 0


@pytest.mark.cli
def test_a_gymnasium_run_fitted_by_observation_resumes_under_the_same_fit(tmp_path):
    run = tmp_path / "run"
    common = [*EPISODES, "env.kwargs.length=40", "env.num_envs=4", "algo.num_steps=64"]
    common += ["algo.num_minibatches=2", "progress=false", "torch_threads=1", f"run_dir={run}"]
    assert train.main([*common, "total_steps=128"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["agent"]["horizon"], saved["agent"]["memory"]) == (40, 40)
    assert train.main([*common, "total_steps=256", "resume=true"]) == 0


def test_bad_horizons_are_refused_with_the_valid_ones(capsys):
    for value in ("0", "soon"):
        assert train.main([f"agent.horizon={value}", "--cfg"]) == 2
        assert "agent.horizon" in capsys.readouterr().err


def test_the_slowest_retention_reaches_four_times_the_distance_where_the_default_falls_short():
    """A linear/delta/additive/mixed memory's slowest head starts at 4 D steps where the default's
    (8192 with 4 heads) is shorter: the passive T-maze 10,000 only; 1,000 and every measured
    task keep the default; a given scale, or a memory without retention, is left alone."""
    cfg = fitted("env=passive_tmaze", "env.kwargs.length=10000")
    assert (cfg.agent.long_memory, cfg.agent.retention_scale) == ("mixed", 40_004)
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


def test_popgyms_originals_are_fitted_as_their_torch_twins():
    """POPGym's envs by id name no time limit; the probe observes the length that each torch
    twin declares, so the original and its twin train the same agent."""
    pytest.importorskip("popgym")
    from rltrans.envs.torch_envs import TORCH_ENVS

    names = {"repeat_first": "RepeatFirst", "repeat_previous": "RepeatPrevious"}
    names |= {"count_recall": "CountRecall", "autoencode": "Autoencode"}
    for twin, name in names.items():
        for level, preset in TORCH_ENVS[twin].popgym_presets.items():
            kwargs = [f"env.kwargs.{k}={v}" for k, v in preset.items()]
            mine = fitted(f"env={twin}", *kwargs)
            theirs = fitted("env=gym", f"env.id=popgym:popgym-{name}{level.title()}-v0")
            assert mine.agent.horizon == theirs.agent.horizon, (twin, level)
            assert (mine.agent, mine.algo) == (theirs.agent, theirs.algo), (twin, level)


def test_the_fit_itself_builds_no_env():
    """Only ``auto`` reads the env (one probe copy, in the plan); the fit to a distance is a
    pure function of the config: an env id that does not exist is never looked up."""
    cfg = load_config(["env=gym", "env.id=NoSuchEnv-v0", "agent.horizon=300"], "train")
    fitted_cfg = horizon.fitted(cfg.copy(), 300)
    assert fitted_cfg.agent.horizon == 300 and fitted_cfg.agent.long_memory == "mixed"
    assert horizon.fit_horizon(cfg.copy()) == fitted_cfg  # an integer horizon: no probe
    assert horizon.fitted(cfg.copy(), None).agent.horizon is None  # nothing known: unchanged
