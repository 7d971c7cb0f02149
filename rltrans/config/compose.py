"""Hydra composition of the shipped configs: overrides parsed and checked key by key, the
composed config validated against :mod:`rltrans.config.schema`, defaults, and --help.

Composition uses Hydra's compose API, so a run never changes the working directory or the
logging setup. A bad value, an unknown key or a bad group choice raises one ConfigError
with one line per problem.

Overrides: ``key=value`` sets a knob; a mapping value merges into the YAML's mapping, and
the keyword-argument mappings (``env.kwargs``, ``agent.encoder``) also take new keys
(``env.kwargs={render_mode: rgb_array}``); ``+key=value`` adds a knob an option's YAML
leaves out; ``~key`` removes an agent knob (its builder's default applies).
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rltrans.config.applies import inapplicable
from rltrans.config.errors import ConfigError, format_problems
from rltrans.config.files import CONFIG_PACKAGE, config_groups, config_root, group_options
from rltrans.config.frozen import thaw
from rltrans.config.schema import agent_knob_names, check_config, keyword_mappings
from rltrans.config.spec import format_value, unknown_key

OVERRIDE_SYNTAX = """\
Overrides: key=value sets a knob. A mapping value merges into the YAML's mapping, and the
keyword mappings (env.kwargs, agent.encoder) take new keys: env.kwargs={render_mode: rgb_array}.
+key=value adds a knob the option's YAML leaves out; ~key removes an agent knob.
A bad value, unknown key or group choice exits with code 2 before anything is built."""
PLAIN_SYNTAX = "Overrides: key=value sets a knob; a bad value or unknown key exits with code 2."


def _compose(config_name: str, overrides: list[str], hydra: bool = False) -> DictConfig:
    from hydra import compose, initialize_config_module

    with initialize_config_module(CONFIG_PACKAGE, version_base="1.3", job_name="rltrans"):
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)


def _hydra_error(err: Exception) -> ConfigError:
    """Hydra's exception as a ConfigError (a bad group choice lists the valid ones)."""
    message = str(err)
    group = re.search(r"Could not find '(\w+)/([^']+)'", message)
    if group:
        name, choice = group.groups()
        return ConfigError(
            f"unknown {name} {choice!r}; valid choices: {', '.join(group_options(name))}"
        )
    missing = re.search(r"Could not override '([^']+)'", message)
    if missing:
        return ConfigError(f"unknown config key {missing.group(1)!r}")
    # Hydra appends a link to its grammar page; the message itself says what is wrong.
    return ConfigError("\n".join(ln for ln in message.strip().splitlines() if "https://" not in ln))


@functools.lru_cache(maxsize=32)
def _defaults(config_name: str, groups: tuple[str, ...]) -> DictConfig:
    """The config for these group choices without value overrides: the keys and their types."""
    try:
        return _compose(config_name, list(groups))
    except Exception as err:  # Hydra raises several exception types; all become ConfigError
        raise _hydra_error(err) from None


def _parse(overrides: list[str]) -> list[Any]:
    """Hydra's parsed overrides (key, type, value), or ConfigError for a malformed one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as err:
        raise _hydra_error(err) from None


def _is_group(override: Any) -> bool:
    return "." not in override.key_or_group and override.key_or_group in config_groups()


def _lookup(node: Any, key: str) -> tuple[Any, list[str]]:
    """(the value at a dotted key or None, the path of the deepest existing ancestor)."""
    path: list[str] = []
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None, path
        node, path = node[part], [*path, part]
    return node, path


def _exists(cfg: DictConfig, key: str) -> bool:
    """Whether a dotted key is in the config (its value may be null)."""
    return len(_lookup(cfg, key)[1]) == key.count(".") + 1


def _all_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a config, mappings included."""
    keys = []
    for name, value in node.items():
        keys.append(f"{prefix}{name}")
        if isinstance(value, DictConfig):
            keys += _all_keys(value, f"{prefix}{name}.")
    return keys


@functools.cache
def _option_keys(config_name: str) -> dict[str, str]:
    """Every key some group option defines -> the first options that do (``algo=offline``)."""
    if config_name != "train":
        return {}
    found: dict[str, list[str]] = {}
    for group in config_groups():
        for option in group_options(group):
            node = OmegaConf.create((config_root() / group / f"{option}.yaml").read_text())
            node.pop("defaults", None)
            for key in _all_keys(node, f"{group}."):
                found.setdefault(key, []).append(f"{group}={option}")
    return {k: " or ".join(v[:3]) + (" ..." if len(v) > 3 else "") for k, v in found.items()}


def _unknown(key: str, defaults: DictConfig, config_name: str) -> str:
    """An unknown key, the near misses of it and the keys valid at its place."""
    _, path = _lookup(defaults, key)
    parent = OmegaConf.select(defaults, ".".join(path)) if path else defaults
    if isinstance(parent, ListConfig):  # env.wrappers.0.kwargs.x: items have no keys of their own
        whole = ".".join(path)
        current = format_value(OmegaConf.to_container(parent))
        return (
            f"config key {key!r}: {whole} is a list, whose items cannot be set one by one; "
            f"set the whole list, quoted, e.g. '{whole}={current}'"
        )
    # A key given without its section (dqn_replay.root), or a typo of a sibling (rooot).
    near = [k for k in _all_keys(defaults) if k.endswith("." + key)]
    prefix, last = "".join(f"{p}." for p in path), key.split(".")[len(path)]
    siblings = [str(k) for k in parent]
    near = near or [prefix + k for k in difflib.get_close_matches(last, siblings, cutoff=0.8)]
    elsewhere = {} if near else _option_keys(config_name)
    near = near or [f"{k} ({elsewhere[k]})" for k in elsewhere if k.endswith("." + key)]
    why = f" (did you mean {' or '.join(near)}?)" if near else ""
    if key in elsewhere:
        why += f" ({elsewhere[key]} defines it)"
    if path == ["agent"] and key.count(".") == 1 and config_name == "train":
        knobs = agent_knob_names(OmegaConf.to_container(defaults.agent))  # type: ignore[arg-type]
        if knobs and last in knobs:  # a knob of this agent that its YAML leaves at the default
            why += f" (this option's YAML leaves it out; add it with +{key}=<value>)"
    return unknown_key(key, siblings, why)


def _check_key(key: str, value: Any, defaults: DictConfig, config_name: str) -> str | None:
    """A problem with setting ``key`` to ``value``: an unknown key, or a mapping value with a
    key the YAML's mapping lacks (a keyword mapping takes any: see rltrans.config.schema)."""
    for mapping in keyword_mappings(config_name):
        if key == mapping or key.startswith(mapping + "."):
            return None if _exists(defaults, mapping) else _unknown(key, defaults, config_name)
    node, _ = _lookup(defaults, key)
    if not _exists(defaults, key):
        return _unknown(key, defaults, config_name)
    if isinstance(node, DictConfig) and isinstance(value, dict):
        for name, item in value.items():
            problem = _check_key(f"{key}.{name}", item, defaults, config_name)
            if problem:
                return problem
    return None


def _check_override(
    override: Any, defaults: DictConfig, config_name: str
) -> tuple[str | None, str | None]:
    """(a problem or None, the override to compose or None to drop it)."""
    text, key = override.input_line, override.key_or_group
    problem = _check_key(key, override.value(), defaults, config_name)
    for mapping in keyword_mappings(config_name):
        below = key == mapping or key.startswith(mapping + ".")
        if not problem and below and _exists(defaults, mapping):
            return None, "++" + text  # a keyword mapping takes new keys: add or override
    return problem, None if problem else text


def _fit_default_segments(cfg: DictConfig) -> None:
    """A PPO segment_length the command line did not give becomes the longest divisor of
    algo.num_steps no longer than it that still splits an update into algo.num_minibatches
    segments: a default made for 128-step rollouts of 16 envs must not fail with fewer."""
    algo, env = cfg.get("algo") or {}, cfg.get("env") or {}
    steps, length = algo.get("num_steps"), algo.get("segment_length")
    count, envs = algo.get("num_minibatches"), env.get("num_envs")
    numbers = (steps, length, count, envs)
    if algo.get("kind") != "online" or not all(type(n) is int and n > 0 for n in numbers):
        return
    OmegaConf.update(cfg, "algo.segment_length", splitting_segment(steps, length, envs, count))


def splitting_segment(num_steps: int, longest: int, num_envs: int, num_minibatches: int) -> int:
    """The longest divisor of ``num_steps`` up to ``longest`` that still splits a PPO update
    (``num_envs`` x ``num_steps`` steps) into at least ``num_minibatches`` segments."""
    most = min(longest, max(1, num_envs * num_steps // num_minibatches))
    return max(d for d in range(1, most + 1) if num_steps % d == 0)


def load_config(
    overrides: list[str], config_name: str = "train", validate: bool = True
) -> DictConfig:
    """Compose configs/<config_name>.yaml with ``key=value`` overrides and check every key
    (``validate``: values too), or raise ConfigError listing every problem at once."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parse(overrides)
    groups = tuple(o.input_line for o in parsed if _is_group(o))
    defaults = _defaults(config_name, groups)
    problems, kept = [], []
    for override in parsed:
        if _is_group(override) or override.type is not OverrideType.CHANGE:
            kept.append(override.input_line)
            continue
        problem, text = _check_override(override, defaults, config_name)
        problems += [problem] if problem else []
        kept += [text] if text else []
    try:
        cfg = _compose(config_name, kept)
    except Exception as err:  # Hydra raises several exception types; all become ConfigError
        raise ConfigError("\n".join([*problems, str(_hydra_error(err))])) from None
    given = {o.key_or_group for o in parsed if not _is_group(o)}
    if config_name == "train" and not {"algo", "algo.segment_length"} & given:
        _fit_default_segments(cfg)
    if validate:
        problems += check_config(cfg, defaults, config_name)
    if validate and config_name == "train" and not cfg.get("resume"):
        # a knob given where it would do nothing: keys and group choices set (runtime=process
        # under PPO does nothing either); on resume the saved run decides the choices, so
        # rltrans.api.resolve checks there, after the merge
        setting = [o.key_or_group for o in parsed if o.type is not OverrideType.DEL]
        problems += inapplicable(cfg, setting)
    if problems:
        raise ConfigError(format_problems(problems))
    return cfg


def default_config(config_name: str = "train", groups: tuple[str, ...] = ()) -> DictConfig:
    """The config of these group choices (``("agent=dt",)``) without value overrides (a copy:
    the cached one types every later composition)."""
    return copy.deepcopy(_defaults(config_name, tuple(groups)))


def config_help(config_name: str = "train", overrides: list[str] | tuple[str, ...] = ()) -> str:
    """--help: the commented YAML of the root config and of the chosen group options (the
    defaults, or those named in ``overrides``), then every group's options."""
    root = config_root()
    lines = [f"== configs/{config_name}.yaml ==", (root / f"{config_name}.yaml").read_text()]
    groups = config_groups() if config_name == "train" else []
    if groups:
        picked = [o.input_line for o in _parse(list(overrides)) if _is_group(o)]
        try:
            choices = _compose(config_name, picked, hydra=True).hydra.runtime.choices
        except Exception as err:
            raise _hydra_error(err) from None
        for group in groups:
            option = choices.get(group)
            lines.append(f"== {group}={option} (configs/{group}/{option}.yaml) ==")
            lines.append((root / group / f"{option}.yaml").read_text())
        for group in groups:
            lines.append(f"== {group}=<option>   (configs/{group}/; * = shown above) ==")
            for option in group_options(group):
                first = (root / group / f"{option}.yaml").read_text().splitlines()[0]
                mark = "*" if option == choices.get(group) else " "
                lines.append(f"  {mark} {option:18s} {first.lstrip('# ').strip()}")
        lines.append("")
    lines.append(OVERRIDE_SYNTAX if groups else PLAIN_SYNTAX)
    return "\n".join(lines)


def to_container(cfg: DictConfig | Mapping[str, Any]) -> dict:
    """Resolved plain-dict copy of a config, composed or frozen (for checkpoints and
    run_dir/config.yaml)."""
    if not OmegaConf.is_config(cfg):
        return thaw(cfg)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
