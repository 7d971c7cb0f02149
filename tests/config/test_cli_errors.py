"""Every bad config value exits with code 2 and one line naming the key, the bad value and
what is valid, before anything is built (no run folder). The CLIs run in-process."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rltrans.collect import main as collect_main
from rltrans.config import Spec, config_specs, default_config, load_config
from rltrans.evaluate import main as evaluate_main
from rltrans.train import main as train_main

MAINS = {"train": train_main, "evaluate": evaluate_main, "collect": collect_main}


def run(name: str, args: list[str], capsys, cwd: Path) -> tuple[int, str]:
    """Exit code and stderr of a CLI run with run_dir in ``cwd`` (which must stay absent)."""
    run_dir = cwd / "run"
    extra = [f"run_dir={run_dir}"] if name == "train" else []
    code = MAINS[name]([*extra, *args])
    assert not run_dir.exists() and not (cwd / "runs").exists(), "a run folder was written"
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("train", ["agent.position=bogus"], "agent.position=bogus: expected one of: none, "),
        ("train", ["total_steps=abc"], "total_steps=abc: expected an integer in [1, 10^15]"),
        ("train", ["total_steps=-5"], "total_steps=-5: expected an integer in [1, 10^15]"),
        ("train", ["algo.lr=abc"], "algo.lr=abc: expected a number > 0"),
        ("train", ["env.num_envs=0"], "env.num_envs=0: expected an integer in [1, 2^20]"),
        ("train", ["checkpoint_every=0"], "checkpoint_every=0: expected an integer >= 1"),
        ("train", ["device=gpu"], "device=gpu: expected auto, cpu, cuda or cuda:<index>"),
        ("train", ["algo.gamma=1.5"], "algo.gamma=1.5: expected a number in (0, 1]"),
        ("train", ["agent.kind=nope"], "agent.kind=nope: expected one of: bc, dt, memory"),
        ("evaluate", ["episodes=0"], "episodes=0: expected an integer in [1, 10^7]"),
        ("evaluate", ["episodes=abc"], "episodes=abc: expected an integer in [1, 10^7]"),
        (
            "evaluate",
            ["deterministic=maybe"],
            "deterministic=maybe: expected null or true or false",
        ),
        ("collect", ["epsilon=[0, 2]"], "epsilon=[0, 2]: expected a number in [0, 1] or a non-"),
    ],
)
def test_a_bad_value_exits_2_naming_key_value_and_valid_ones(
    name, args, expected, capsys, tmp_path
):
    code, err = run(name, args, capsys, tmp_path)
    assert code == 2
    assert err.startswith(f"error: {expected}"), err
    assert len(err.strip().splitlines()) == 1  # one message, no traceback


def test_two_bad_keys_are_both_reported(capsys, tmp_path):
    code, err = run("train", ["total_steps=abc", "agent.position=bogus"], capsys, tmp_path)
    assert code == 2
    assert err.startswith("error: 2 config problems:")
    assert "total_steps=abc: expected an integer" in err
    assert "agent.position=bogus: expected one of:" in err and "rotary" in err


def test_atari_env_composes(capsys):
    assert train_main(["env=atari", "--cfg"]) == 0
    assert "atari: 'on'" in capsys.readouterr().out


def test_help_with_group_choices_shows_their_knobs(capsys):
    assert train_main(["agent=dt", "--help"]) == 0
    out = capsys.readouterr().out
    assert "== agent=dt (configs/agent/dt.yaml) ==" in out and "max_timestep: null" in out
    assert evaluate_main(["--help"]) == 0
    assert "target_return: null" in capsys.readouterr().out


# ------------------------------------------------------------------------------ fuzzing


def bad_overrides(spec: Spec) -> list[str]:
    """Values a key with this spec must refuse: wrong types, out of range, unknown choices."""
    wrong_type = {
        "int": ["abc", "true", "1.5", "[1]"],
        "float": ["abc", "true", "[1]", "nan"],
        "numbers": ["abc", "[]", "true"],
        "bool": ["maybe", "2", "abc"],
        "choice": ["bogus_choice", "3", "true"],
        "str": ["[1]", "{a: 1}", "true"],
        "device": ["gpu", "cuda:x", "3"],
        "list": ["3", "abc"],
        "mapping": ["3", "abc"],
    }.get(spec.type, [])
    out_of_range = []
    if spec.type in ("int", "float", "numbers"):
        if spec.low is not None:
            out_of_range.append(str(spec.low if spec.open_low else spec.low - 1))
        if spec.high is not None:
            out_of_range.append(str(spec.high if spec.open_high else spec.high + 1))
    if spec.item_keys:
        wrong_type.append("[{kwargs: {}}]")  # an item without its required key
    return wrong_type + out_of_range


def documented(name: str) -> dict[str, Spec]:
    """Every key of a config's defaults (train: the default groups) with its spec."""
    cfg = load_config([], name)
    specs = config_specs(cfg, default_config(name), name)
    keys = {k: s for k, s in specs.items() if s is not None and bad_overrides(s)}
    # A mapping whose entries are listed is fuzzed through its entries (one override each).
    return {k: s for k, s in keys.items() if not any(o.startswith(k + ".") for o in keys)}


KEYS = {name: documented(name) for name in MAINS}


@pytest.mark.parametrize("name", list(MAINS))
def test_a_bad_value_for_every_documented_key_at_once_names_every_key(name, capsys, tmp_path):
    # kind keys pick which specs apply to their section: fuzzed alone below
    keys = {k: s for k, s in KEYS[name].items() if not k.endswith("kind")}
    args = [f"{key}={bad_overrides(spec)[0]}" for key, spec in keys.items()]
    code, err = run(name, args, capsys, tmp_path)
    assert code == 2
    missing = [key for key in keys if f"\n  {key}=" not in err]
    assert not missing, err


@pytest.mark.cli
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_random_bad_values_exit_2_naming_each_key(data, capsys, tmp_path):
    name = data.draw(st.sampled_from(list(MAINS)), label="config")
    keys = sorted(KEYS[name])
    plain = [k for k in keys if not k.endswith("kind")]
    chosen = data.draw(
        st.one_of(
            st.lists(st.sampled_from(plain), min_size=1, max_size=4, unique=True),
            st.sampled_from(keys).map(lambda k: [k]),
        ),
        label="keys",
    )
    args = [
        f"{k}={data.draw(st.sampled_from(bad_overrides(KEYS[name][k])), label=k)}" for k in chosen
    ]
    code, err = run(name, args, capsys, tmp_path)
    assert code == 2, err
    for key in chosen:
        assert f"{key}=" in err, (key, err)
