"""The config schema and composition (rltrans.config): every YAML knob is
typed, every shipped option passes its own checks, YAML misreadings are caught, mapping
values merge, and --help shows the chosen options' knobs."""

import ast
import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rltrans.config import (
    ConfigError,
    check_config,
    config_groups,
    config_help,
    config_root,
    config_specs,
    default_config,
    group_options,
    load_config,
)

# Options that only make sense with an offline agent (their own cross check says so), and
# the runtimes, which only IMPALA uses (refused under PPO).
NEEDS = {("algo", "offline"): ["agent=bc"], ("env", "dataset"): ["agent=bc"]}
NEEDS |= {("runtime", option): ["algo=impala"] for option in group_options("runtime")}


def every_option() -> list[tuple[str, list[str]]]:
    """(config name, group overrides) for every root config and every group option."""
    cases = [("train", []), ("evaluate", []), ("collect", [])]
    for group in config_groups():
        for option in group_options(group):
            cases.append(("train", [*NEEDS.get((group, option), []), f"{group}={option}"]))
    return cases


@pytest.mark.parametrize(("name", "groups"), every_option(), ids=lambda v: str(v))
def test_every_documented_key_has_a_spec_and_its_default_is_valid(name, groups):
    cfg = load_config(groups, name)  # raises on any problem of the shipped defaults
    specs = config_specs(cfg, default_config(name, tuple(groups)), name)
    uncovered = [key for key, spec in specs.items() if spec is None]
    assert not uncovered, (
        f"keys with a null default need a table entry in rltrans.config.schema: {uncovered}"
    )
    assert "seed" in specs or "episodes" in specs


def yaml_files() -> list[str]:
    root = config_root()
    names = [f"{p.name}" for p in root.iterdir() if p.name.endswith(".yaml")]
    names += [f"{g}/{o}.yaml" for g in config_groups() for o in group_options(g)]
    return names


@pytest.mark.parametrize("name", yaml_files())
def test_yaml_values_are_never_yaml_1_1_booleans_and_knobs_are_commented(name):
    text = (config_root() / name).read_text()
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("#", "-")) or ":" not in line:
            continue
        value = line.split(":", 1)[1].split("#", 1)[0].strip()
        # YAML 1.1 reads these words as booleans (atari: on was True): quote them.
        assert value.lower() not in {"on", "off", "yes", "no", "y", "n"}, f"{name}:{number}"
        if not line.startswith("defaults"):
            assert "#" in line, f"{name}:{number}: every knob carries a comment: {line!r}"


def test_atari_env_as_composed_passes_validation_and_the_env_checks():
    from rltrans.envs.gym_vec import is_ale_spec, make_vector_env, resolve_env_spec

    env = load_config(["env=atari"]).env
    assert env.atari == "on" and env.kind == "gym"
    hints = typing.get_type_hints(make_vector_env)
    assert env.atari in typing.get_args(hints["atari"])
    assert env.vectorization in typing.get_args(hints["vectorization"])
    assert env.num_envs >= 1 and dict(env.kwargs).get("frameskip", 1) == 1
    pytest.importorskip("ale_py")
    _, name, spec = resolve_env_spec(env.id)  # registers ALE ids; loads no ROM
    assert is_ale_spec(name, spec)


def test_a_yaml_boolean_for_a_choice_explains_the_quoting():
    with pytest.raises(
        ConfigError, match=r"env\.atari=true: expected one of: auto, on, off.*quote"
    ):
        load_config(["env=gym", "env.atari=true"])
    assert load_config(["env=gym", "env.atari=on"]).env.atari == "on"


def test_mapping_values_merge_and_keyword_mappings_take_new_keys():
    env = load_config(["env=gym", "env.kwargs={agent_view_size: 3}"]).env
    assert OmegaConf.to_container(env.kwargs) == {"agent_view_size": 3}
    env = load_config(["env.kwargs={length: 30}"]).env  # tmaze: the other kwargs stay
    assert env.kwargs.length == 30 and env.kwargs.idle_penalty == 0.1
    assert load_config(["agent.encoder.activation=tanh"]).agent.encoder.activation == "tanh"
    with pytest.raises(ConfigError) as err:
        load_config(["env.kwargs={agent_view_size: 3}"])  # not a T-maze argument
    message = str(err.value)
    assert "'env.kwargs.agent_view_size'" in message and "tmaze" in message
    assert "length" in message and "idle_penalty" in message


def test_unknown_keys_name_the_near_miss_and_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(["dqn_replay.root=x"])
    assert "did you mean algo.dqn_replay.root (algo=offline)?" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(["agent=bc", "algo.dqn_replay={rooot: x}"])
    message = str(err.value)
    assert "'algo.dqn_replay.rooot'" in message and "frame_stack, order, padding" in message
    assert load_config(["agent=bc", "algo.dqn_replay.root=x"]).algo.dqn_replay.root == "x"
    with pytest.raises(ConfigError, match=r"\+agent\.norm=<value>"):
        load_config(["agent.norm=post"])  # a knob gtrxl.yaml leaves out
    assert load_config(["+agent.norm=post"]).agent.norm == "post"
    with pytest.raises(ConfigError, match="unknown config key 'agent.bogus'"):
        load_config(["+agent.bogus=1"])


def test_a_key_inside_a_list_says_to_set_the_whole_list_and_its_suggestion_loads():
    key = "env.wrappers.0.kwargs.tile_size=8"
    with pytest.raises(ConfigError) as err:
        load_config(["env=minigrid_memory", key])
    message = str(err.value)
    assert "env.wrappers is a list" in message and "valid keys" not in message
    suggestion = re.search(r"'(env\.wrappers=\[.*\])'", message).group(1)
    cfg = load_config(["env=minigrid_memory", suggestion.replace("tile_size: 28", "tile_size: 8")])
    assert cfg.env.wrappers[0].kwargs.tile_size == 8
    assert cfg.env.wrappers[1].path == "minigrid.wrappers.ImgObsWrapper"


def test_every_problem_is_reported_at_once_and_numbers_get_their_type():
    with pytest.raises(ConfigError) as err:
        load_config(["total_steps=abc", "algo.gamma=0", "agent.headss=2", "~seed"])
    lines = str(err.value).splitlines()
    assert lines[0] == "4 config problems:"
    assert any(ln.strip() == "total_steps=abc: expected an integer in [1, 10^15]" for ln in lines)
    assert any("algo.gamma=0: expected a number in (0, 1]" in ln for ln in lines)
    assert any("'agent.headss' (did you mean agent.heads?)" in ln for ln in lines)
    assert any("'seed' was removed" in ln for ln in lines)
    cfg = load_config(["total_steps=1e5", "algo.lr=1"])
    assert cfg.total_steps == 100000 and type(cfg.total_steps) is int
    assert type(cfg.algo.lr) is float


def test_cross_checks_name_both_keys():
    with pytest.raises(
        ConfigError, match=r"agent\.heads=3: must divide agent\.dim=64; valid: 1, 2, 4"
    ):
        load_config(["agent.heads=3"])
    with pytest.raises(ConfigError, match=r"algo\.segment_length=5: must divide algo\.num_steps"):
        load_config(["algo.segment_length=5"])
    with pytest.raises(ConfigError, match=r"agent\.layers=2: backbone universal has no layers"):
        load_config(["agent=ut_act", "+agent.layers=2"])
    with pytest.raises(ConfigError, match=r"env\.kind=dataset.*algo\.kind=offline"):
        load_config(["env=dataset"])


def test_an_auto_word_is_valid_only_where_the_yaml_default_offers_it():
    defaults = default_config("train")
    cfg = load_config(["torch_threads=auto"])
    assert defaults.torch_threads == "auto" and check_config(cfg, defaults, "train") == []
    defaults.torch_threads = 1  # a YAML whose default is a count does not offer the word
    problems = check_config(cfg, defaults, "train")
    assert problems == ["torch_threads=auto: expected an integer in [0, 1024]"]


def test_help_shows_the_chosen_options_with_their_comments():
    text = config_help("train", ["agent=dt"])
    assert "== agent=dt (configs/agent/dt.yaml) ==" in text
    assert re.search(r"context: 20 +# K: steps per window", text)
    assert "== algo=offline (configs/algo/offline.yaml) ==" in text  # dt selects it
    assert "== env=dataset" in text and "* dt" in text
    text = config_help("train", ["algo=offline"])
    assert "warmup_updates: 10000" in text and "== agent=gtrxl" in text
    evaluate = config_help("evaluate")
    assert "episodes: 20" in evaluate and "== agent=" not in evaluate
    with pytest.raises(ConfigError, match="unknown agent 'nope'"):
        config_help("train", ["agent=nope"])


# The config package imports one way: each module only from those before it in this list.
CONFIG_MODULES = [
    "frozen",
    "errors",
    "files",
    "spec",
    "resources",
    "run_settings",
    "keys",
    "schema",
    "applies",
    "compose",
    "trust",
    "plan",
    "settings_files",
]


def test_the_config_package_imports_one_way():
    package = Path(__file__).resolve().parents[2] / "rltrans" / "config"
    assert sorted(p.stem for p in package.glob("*.py")) == sorted([*CONFIG_MODULES, "__init__"])
    for rank, name in enumerate(CONFIG_MODULES):
        tree = ast.parse((package / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {
            "rltrans.config." * (n.level > 0) + (n.module or "")
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom)
        }
        inside = {m.split(".")[2] for m in imported if m.startswith("rltrans.config.")}
        assert "rltrans.config" not in imported, f"{name} imports the package's __init__"
        assert inside <= set(CONFIG_MODULES[:rank]), f"{name} imports {inside}"
