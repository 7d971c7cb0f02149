"""benchmarks/offline_mujoco.py's dataset maker on small data: medium-replay keeps the recorded
training episodes in the order they were played up to the medium policy's step, every
dataset is a Minari dataset carrying D4RL's reference returns, medium-expert is medium then
expert; and the table's Spearman correlation is Spearman's."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rltrans.envs.minari_data import load_minari
from rltrans.envs.recorder import EpisodeRecorder
from tests.helpers.scripts import benchmark_script

pytest.importorskip("mujoco", reason="the mujoco extra: pip install -e '.[mujoco]'")


@pytest.fixture(scope="module")
def maker():
    with benchmark_script("offline_mujoco") as module:
        yield module


@pytest.fixture(autouse=True)
def _minari_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


def _record(folder: Path, episodes: int) -> list[int]:
    """Random Hopper-v5 episodes through the recorder, as a behaviour run records them."""
    env = EpisodeRecorder(gym.make("Hopper-v5"), folder=str(folder), flush_steps=50)
    env.action_space.seed(0)
    lengths = []
    for k in range(episodes):
        env.reset(seed=k)
        t, ended = 0, False
        while not ended:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            t, ended = t + 1, terminated or truncated
        lengths.append(t)
    env.close()
    return lengths


def test_medium_replay_keeps_the_training_episodes_up_to_the_medium_step(maker, tmp_path):
    lengths = _record(tmp_path / "replay", episodes=12)
    until = sum(lengths[:7]) + lengths[7] // 2  # the 8th episode ends after the medium step
    made = maker.replay("Hopper-v5", tmp_path, until)
    assert made["dataset_id"] == "rltrans/hopper/medium-replay-v0"
    assert (made["episodes"], made["steps"]) == (7, sum(lengths[:7]))
    data = load_minari(made["dataset_id"], progress=False)
    assert [len(ep) for ep in data.episodes] == lengths[:7]
    assert data.reference_scores() == (-20.27, 3234.3)  # D4RL's Hopper random and expert
    assert data.env_id == "Hopper-v5"


def test_medium_expert_is_medium_then_expert(maker, tmp_path):
    rng = np.random.default_rng(0)

    def episodes(n: int, reward: float) -> list:
        from rltrans.envs.offline import Episode

        return [
            Episode(
                rng.normal(size=(5, 17)), rng.uniform(-1, 1, (5, 6)), np.full(5, reward),
                truncated=True, final_observation=rng.normal(size=17),
            )
            for _ in range(n)
        ]  # fmt: skip

    maker.write("HalfCheetah-v5", "medium", episodes(3, 1.0), "medium")
    maker.write("HalfCheetah-v5", "expert", episodes(2, 9.0), "expert")
    made = maker.combined("HalfCheetah-v5")
    data = load_minari(made["dataset_id"], progress=False)
    assert [ep.episode_return for ep in data.episodes] == [5.0] * 3 + [45.0] * 2
    assert data.reference_scores() == (-280.18, 12135.0)


def test_spearman_is_the_rank_correlation(maker):
    assert maker.spearman([1, 2, 3, 4, 5], [10, 20, 15, 40, 50]) == pytest.approx(0.9)
    assert maker.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert maker.spearman([1, 2, 3, 4], [1, 3, 3, 4]) == pytest.approx(0.9486832980505138)
    assert maker.spearman([1, 2, 3], [7, 7, 7]) == 0.0


def test_the_medium_policy_is_the_first_checkpoint_at_a_third_of_the_final_one(
    maker, tmp_path, monkeypatch
):
    checkpoints = tmp_path / "behaviour" / "checkpoints"
    checkpoints.mkdir(parents=True)
    returns = {
        "last": 3000.0,
        **{f"step_{s:012d}": r for s, r in [(1, 50), (2, 900), (3, 1100), (4, 800), (5, 2000)]},
    }
    for name in returns:
        (checkpoints / f"{name}.pt").touch()
    probed = []

    def probe(paths, env_id):
        probed.extend(p.stem for p in paths)
        return [
            {"mean_return": returns[p.stem], "std_return": 1.0, "mean_length": 10.0} for p in paths
        ]

    monkeypatch.setattr(maker, "probe", probe)
    chosen = maker.medium_policy("Hopper-v5", tmp_path)
    assert chosen["medium_step"] == 3 and chosen["medium"]["mean_return"] == 1100  # >= 1000
    assert chosen["expert"]["mean_return"] == 3000
    assert maker.medium_policy("Hopper-v5", tmp_path) == chosen  # cached: not probed again
    assert probed.count("last") == 1


def test_dt_is_scored_on_the_papers_targets_and_on_targets_up_to_the_datas_best(maker):
    goals = maker.targets("Hopper-v5", "dt", best=1421.0)
    assert goals == [720, 1440, 2160, 2880, 3600, 284, 568, 853, 1137, 1421]
    assert maker.targets("Hopper-v5", "bc", best=1421.0) == [3600.0]
    returns = dict(zip(goals, [891, 1051, 1122, 935, 894, 250, 600, 970, 1220, 1030], strict=True))
    run = maker.Result(
        "Hopper-v5", "medium-replay", "dt", 1, {f"{t:g}": r for t, r in returns.items()},
        27.9, 4.0, "run", data_best=1421.0,
    )  # fmt: skip
    assert maker._rank_cell([run], "paper") == "0 of 1 (0.10)"
    assert maker._rank_cell([run], "data") == "1 of 1 (0.90)"
    assert maker._at_best([run]) == f"{100 * (1030 + 20.27) / (3234.3 + 20.27):.1f} (32.3)"
