"""A knob given where it does nothing is refused (exit 2, naming it); the same knob under the
choice it belongs to is accepted. One case per rule, so a new rule needs a case here."""

import pytest

from rltrans.config import ConfigError, load_config
from rltrans.config.applies import RULES
from rltrans.train import main as train_main

# key -> (overrides under which it does nothing, overrides under which it applies)
CASES = {
    "agent.heads": (["agent=gru", "agent.heads=2"], ["agent.heads=2"]),
    "agent.memory": (["agent=lstm", "agent.memory=16"], ["agent.memory=16"]),
    "agent.long_memory": (
        ["agent=gtrxl", "agent.backbone=gru", "agent.long_memory=delta"],
        ["agent.long_memory=delta"],
    ),
    "agent.position": (
        ["agent=trxl", "agent.backbone=lstm", "agent.position=rotary"],
        ["agent.position=rotary"],
    ),
    "agent.gate": (["agent.backbone=mlp", "agent.gate=highway"], ["agent.gate=highway"]),
    "agent.chunk": (["agent.backbone=gru", "agent.chunk=16"], ["agent.chunk=16"]),
    "agent.adaptive_span": (
        ["agent.backbone=lstm", "agent.adaptive_span=true"],
        ["agent.adaptive_span=true"],
    ),
    "agent.horizon": (
        ["agent.backbone=mlp", "agent.horizon=50"],
        ["agent=gru", "agent.horizon=50"],
    ),
    "agent.compressed_slots": (
        ["agent.compressed_slots=8"],
        ["agent.long_memory=compressive", "agent.compressed_slots=8"],
    ),
    "agent.compression_rate": (
        ["agent.long_memory=delta", "agent.compression_rate=4"],
        ["agent.long_memory=compressive", "agent.compression_rate=4"],
    ),
    "agent.retention_scale": (
        ["agent.long_memory=none", "agent.retention_scale=1000"],
        ["agent.long_memory=delta", "agent.retention_scale=1000"],
    ),
    "agent.span_ramp": (["agent.span_ramp=4"], ["agent.adaptive_span=true", "agent.span_ramp=4"]),
    "agent.span_coef": (
        ["agent.span_coef=0.01"],
        ["agent.adaptive_span=true", "agent.span_coef=0.01"],
    ),
    "agent.gate_bias": (
        ["agent.gate=residual", "agent.gate_bias=1"],
        ["agent.gate=highway", "agent.gate_bias=1"],
    ),
    "agent.shaw_max_distance": (
        ["+agent.shaw_max_distance=8"],
        ["agent.position=shaw", "+agent.shaw_max_distance=8"],
    ),
    "agent.max_len": (["+agent.max_len=64"], ["agent.position=learned", "+agent.max_len=64"]),
    "total_steps": (["agent=dt", "total_steps=100"], ["total_steps=100"]),
    "train_steps": (["train_steps=100"], ["agent=dt", "train_steps=100"]),
    "dataset": (
        ["dataset=mujoco/hopper/expert-v0"],
        ["agent=dt", "dataset=mujoco/hopper/expert-v0"],
    ),
    "dataset_kind": (["dataset_kind=minari"], ["agent=dt", "dataset_kind=minari"]),
    "runtime": (["runtime=process"], ["algo=impala", "runtime=process"]),
    "rollout": (["algo=impala", "rollout=device"], ["rollout=device"]),
}


def test_every_rule_has_a_case():
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_knob_that_does_nothing_is_refused(key, capsys):
    idle, applies = CASES[key]
    assert train_main([*idle, "total_steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"{key}=" in err and "does nothing with" in err and "it applies only with" in err
    load_config(applies)  # where it applies, the same value is taken


def test_a_groups_rule_covers_the_keys_below_it(capsys):
    """runtime.num_actors under PPO is refused like runtime=process; under IMPALA it is taken."""
    assert train_main(["runtime.num_actors=2", "total_steps=1"]) == 2
    assert "runtime.num_actors=2 does nothing with algo.kind=online" in capsys.readouterr().err
    assert load_config(["algo=impala", "runtime.num_actors=2"]).runtime.num_actors == 2


def test_only_knobs_the_command_line_gives_are_checked():
    cfg = load_config(["agent=gtrxl", "agent.long_memory=none"])  # YAML's compressed_slots stays
    assert cfg.agent.compressed_slots == 32
    load_config(["agent.long_memory=none", "agent.retention_scale=null"])  # null asks nothing
    with pytest.raises(ConfigError) as err:
        load_config(["agent.span_ramp=4", "agent.compressed_slots=8"])
    assert "agent.span_ramp" in str(err.value) and "agent.compressed_slots" in str(err.value)


def test_the_train_guide_lists_every_rule():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs/guides/train.md").read_text()
    table = guide[guide.index("| knob | applies only with |") :]
    for key, rule in RULES.items():
        row = next((ln for ln in table.splitlines() if f"`{key}`" in ln), None)
        assert row is not None, key
        assert f"`{rule.when}" in row or rule.when.split(".")[1] in row, (key, row)


@pytest.mark.cli
def test_on_resume_the_saved_runs_choices_decide(tmp_path, capsys):
    """resume=true composes with the default algo first; the check waits for the saved run:
    train_steps on a resumed PPO run is refused, total_steps continues it."""
    from tests.helpers.cli import TINY_PPO

    run = f"run_dir={tmp_path}"
    assert train_main([*TINY_PPO, "total_steps=64", run, "tensorboard=false"]) == 0
    capsys.readouterr()
    assert train_main(["resume=true", run, "train_steps=8"]) == 2
    assert "train_steps=8 does nothing with algo.kind=online" in capsys.readouterr().err
    assert train_main(["resume=true", run, "total_steps=128"]) == 0
