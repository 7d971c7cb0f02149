"""A Discrete observation teaches an agent what its one-hot code does, and POPGym's env teaches
what its torch-native twin does.

POPGym's repeat-first (Easy: 51 steps, Discrete(4) cards) through its Gymnasium id, the same
env with its observation one-hot (``gymnasium.wrappers.FlattenObservation``) and the torch twin
at the same preset train the same agent with the same seeds and settings. Each ends well above
chance, and their evaluated returns lie within the seeds' spread of each other; a memoryless
agent on the original stays at chance, so only a remembered first card passes.
"""

from __future__ import annotations

import statistics

import pytest

from rltrans.envs.torch_envs import TORCH_ENVS
from rltrans.evaluate import main as evaluate_main
from rltrans.train import main as train_main
from tests.helpers.cli import summary_line

pytest.importorskip("popgym")

SEEDS = (1, 2)
STEPS = 60_000
ORIGINAL = ["env=gym", "env.id=popgym:popgym-RepeatFirstEasy-v0"]
ONE_HOT = [*ORIGINAL, "env.wrappers=[{path: gymnasium.wrappers.FlattenObservation}]"]
TWIN = [
    "env=repeat_first",
    *(f"env.kwargs.{k}={v}" for k, v in TORCH_ENVS["repeat_first"].popgym_presets["easy"].items()),
]
SETTINGS = ["env.num_envs=16", f"total_steps={STEPS}", "progress=false"]  # the agents' defaults
CHANCE = -0.5  # a random card is right a quarter of the time: (1 - 3) / 4
LEARNED = 0.2  # well above chance within the budget
SLACK = 0.15  # what the spread of two seeds may miss by


def evaluated(env: list[str], agent: str, seed: int, run_dir, capsys) -> float:
    """The mean return of 100 deterministic episodes after training ``agent`` on ``env``."""
    trust = ["trust_env_code=true"] if env[0] == "env=gym" else []
    args = [*env, f"agent={agent}", *SETTINGS, f"seed={seed}", f"run_dir={run_dir}"]
    assert train_main(args) == 0
    capsys.readouterr()
    assert evaluate_main([f"checkpoint={run_dir}", "episodes=100", "num_envs=20", *trust]) == 0
    return float(summary_line(capsys.readouterr().out)["mean_return"])


@pytest.mark.slow
def test_a_discrete_observation_learns_as_its_one_hot_code_and_its_torch_twin(tmp_path, capsys):
    returns = {
        name: [evaluated(env, "gtrxl", s, tmp_path / f"{name}-{s}", capsys) for s in SEEDS]
        for name, env in (("original", ORIGINAL), ("one_hot", ONE_HOT), ("twin", TWIN))
    }
    control = evaluated(ORIGINAL, "mlp", 1, tmp_path / "mlp", capsys)
    print({name: [round(r, 2) for r in values] for name, values in returns.items()}, control)
    assert control < CHANCE + 0.1
    for values in returns.values():
        assert min(values) > LEARNED
    means = {name: statistics.mean(values) for name, values in returns.items()}
    spread = max(max(values) - min(values) for values in returns.values())
    assert max(means.values()) - min(means.values()) <= spread + SLACK
