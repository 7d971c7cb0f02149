"""The trust boundary: every config rltrans reads from a file passes here before anything is
built or imported.

Files are a checkpoint's config (``rltrans.evaluate``, ``rltrans.collect``, ``load_policy``),
a run folder's ``config.yaml`` (``resume=true``) and a Minari dataset's environment spec
(offline training). Each is checked as strictly as a command line, and more:

- plain values only: mappings with string keys, lists, strings, numbers, booleans and null,
  at most :data:`MAX_DEPTH` levels and :data:`MAX_VALUES` values; no ``_target_`` anywhere
  (code to call), no ``${...}`` (rltrans writes configs resolved, so a file's interpolation is
  an edit, and resolving one would copy environment values into the files people share),
  no ``???`` (OmegaConf's missing value); YAML is read with the safe loader, so tags such as
  ``!!python/object`` are refused, and depth and size are checked before anything is copied;
- dotted keys (``algo.gamma: 0.9``) read as nested ones, so that comparing a run folder's
  config.yaml with its checkpoint sees them;
- the whole config against the command line's schema (types, ranges, choices, the cross
  checks and the memory estimate); keys that a file from an older rltrans lacks take their
  defaults;
- code to import: :func:`env_code` lists what building an env config would import or call
  outside the trusted packages (or a ``render_mode`` that opens a window); a file's env config
  naming any is refused unless the user passes ``trust_env_code=true`` on the command line of
  the process that runs. Trust is never read from a file: a saved ``trust_env_code`` is
  dropped, so a resume asks again.

>>> env_code({"kind": "gym", "id": "my_pkg:Maze-v0", "wrappers": []})
["env.id: module 'my_pkg'"]
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rltrans.config.compose import default_config
from rltrans.config.errors import ConfigError, format_problems
from rltrans.config.files import config_root, group_options
from rltrans.config.schema import check_config, keyword_mappings
from rltrans.fsutil import read_text

MAX_DEPTH = 12  # mappings and lists nested deeper than any shipped config
MAX_VALUES = 20_000  # values in one config (a shipped one holds about 150)
MAX_YAML_BYTES = 2**20  # bytes of a config.yaml (a saved one holds about 4,000)
# Code an env config may name without the user's say-so: gymnasium's and rltrans's own
# modules, ale-py's registrations and minigrid's (env=minigrid_memory names its ids).
TRUSTED_ROOTS = ("gymnasium", "ale_py", "minigrid", "rltrans")
# Wrappers of trusted modules that write files or open windows: refused from files as well.
SIDE_EFFECT_WRAPPERS = ("RecordVideo", "HumanRendering", "EpisodeRecorder")
# Render modes that draw into arrays or text: any other (``human``) opens a window.
QUIET_RENDER_MODES = (None, "rgb_array", "rgb_array_list", "ansi", "ansi_list")
# The config groups: a saved config has one section each, checked against its kind's options.
_GROUPS = ("env", "algo", "runtime", "agent")


# ----------------------------------------------------------------------------- plain values


def read_yaml(path: Path) -> Any:
    """A YAML file's data through the safe loader, or ConfigError naming the file."""
    try:
        # A regular file only (a FIFO would block the read forever), of a config's size.
        text = read_text(path, limit=MAX_YAML_BYTES)
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err}); not an rltrans config") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        first = " ".join(str(err).split())
        raise ConfigError(f"{path}: not valid YAML ({first})") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ConfigError(
            f"{path}: nested deeper than the YAML parser can follow; not an rltrans config"
        ) from None


def plain_problems(
    value: Any, key: str = "", depth: int = 0, count: list[int] | None = None
) -> list[str]:
    """Why ``value`` is not a tree of plain config values (``_target_``, ``${...}``, other
    types, too deep or too large), one line per problem naming its key."""
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_VALUES:
        return [f"{key or 'config'}: more than {MAX_VALUES} values; not an rltrans config"]
    if depth > MAX_DEPTH:
        return [f"{key}: nested deeper than {MAX_DEPTH} levels; not an rltrans config"]
    if isinstance(value, dict):
        problems = []
        for name, item in value.items():
            if not isinstance(name, str):
                problems.append(f"{key}[{name!r}]: keys must be strings")
                continue
            sub = f"{key}.{name}" if key else name
            if name == "_target_":
                problems.append(
                    f"{sub}={item!r}: a config may not name code to call (rltrans never imports "
                    "a class named by a file); agents are chosen with agent.kind"
                )
                continue
            problems += plain_problems(item, sub, depth + 1, count)
        return problems
    if isinstance(value, list):
        problems = []
        for i, item in enumerate(value):
            problems += plain_problems(item, f"{key}[{i}]", depth + 1, count)
        return problems
    if isinstance(value, str):
        if value == "???":  # OmegaConf's mark of a missing value: reading it raises
            return [f"{key}='???': a missing value; write the value itself"]
        if "${" in value:
            return [
                f"{key}={value!r}: interpolations are not resolved from files (rltrans writes "
                "configs resolved); write the value itself"
            ]
        return []
    if value is None or isinstance(value, bool | int):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{key}={value}: not a finite number"]
    return [f"{key}: a {type(value).__name__} is not a config value"]


# ----------------------------------------------------------------------------- the schema


@functools.cache
def _option_data(group: str, option: str) -> dict:
    """A shipped group option's own keys (its defaults list dropped)."""
    data = yaml.safe_load((config_root() / group / f"{option}.yaml").read_text()) or {}
    data.pop("defaults", None)
    return data


def _pick(group: str, section: Any) -> tuple[str | None, list[str]]:
    """(the shipped option a saved section is closest to, every option of the same kind)."""
    if not isinstance(section, dict):
        return None, []
    same = [
        o for o in group_options(group) if _option_data(group, o).get("kind") == section.get("kind")
    ]
    for field in ("backbone", "name"):  # gtrxl vs lstm; tmaze vs repeat_previous
        exact = [
            o for o in same if _option_data(group, o).get(field) == section.get(field) is not None
        ]
        if exact:
            return exact[0], same
    return (same[0] if same else None), same


def _merge_missing(target: dict, source: dict) -> None:
    """Add ``source``'s keys that ``target`` lacks (recursively), keeping target's values."""
    for name, value in source.items():
        if name not in target:
            target[name] = copy.deepcopy(value)
        elif isinstance(target[name], dict) and isinstance(value, dict):
            _merge_missing(target[name], value)


def _base(data: dict) -> dict:
    """The defaults a saved train config is checked against: the shipped options of its kinds,
    with the keys of every option of the same kind (a file may come from any of them)."""
    picks = {g: _pick(g, data.get(g)) for g in _GROUPS}
    choices = tuple(f"{g}={p}" for g, (p, _) in picks.items() if p is not None)
    try:
        base = OmegaConf.to_container(default_config("train", choices), resolve=True)
    except ConfigError:
        base = OmegaConf.to_container(default_config("train"), resolve=True)
    assert isinstance(base, dict)
    for group, (_, same) in picks.items():
        if isinstance(base.get(group), dict):
            for option in same:
                _merge_missing(base[group], _option_data(group, option))
    return base


def _fill_missing(data: dict, base: dict, prefix: str = "") -> None:
    """Give keys an older file lacks their default (agent knobs take the builder's default)."""
    for name, default in base.items():
        key = prefix + name
        if key == "agent" and isinstance(data.get("agent"), dict):
            continue  # agent knobs a file lacks take their builder's defaults
        keywords = key in keyword_mappings("train")  # env.kwargs, agent.encoder: no defaults
        if name not in data:
            data[name] = {} if keywords else copy.deepcopy(default)
        elif isinstance(default, dict) and isinstance(data[name], dict) and not keywords:
            _fill_missing(data[name], default, key + ".")


def _expanded(value: Any, key: str = "") -> tuple[Any, list[str]]:
    """A copy of a plain tree with dotted keys expanded (``{"a.b": 1}`` -> ``{"a": {"b": 1}}``,
    as OmegaConf reads a dotted key), so that comparing two configs sees every edit; a key
    given both ways with two values is a problem."""
    if isinstance(value, list):
        items = [_expanded(item, f"{key}[{i}]") for i, item in enumerate(value)]
        return [v for v, _ in items], [p for _, ps in items for p in ps]
    if not isinstance(value, dict):
        return copy.deepcopy(value), []
    out: dict = {}
    problems: list[str] = []
    for name, item in value.items():
        *parents, last = name.split(".") if name.strip(".") == name else [name]
        sub, found = _expanded(item, f"{key}.{name}" if key else name)
        problems += found
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        full = f"{key}.{name}" if key else name
        if not isinstance(node, dict):
            problems.append(f"{full}: its parent is a value, not a mapping")
        elif last in node and isinstance(node[last], dict) and isinstance(sub, dict):
            merged, clash = _merge_same(node[last], sub, full)
            node[last] = merged
            problems += clash
        elif last in node and node[last] != sub:
            problems.append(f"{full}: given twice (as a dotted key and nested) with two values")
        else:
            node[last] = sub
    return out, problems


def _merge_same(old: dict, new: dict, key: str) -> tuple[dict, list[str]]:
    """Merge two expanded mappings given for one key; a leaf given twice must agree."""
    problems = []
    for name, value in new.items():
        if name in old and isinstance(old[name], dict) and isinstance(value, dict):
            old[name], found = _merge_same(old[name], value, f"{key}.{name}")
            problems += found
        elif name in old and old[name] != value:
            problems.append(
                f"{key}.{name}: given twice (as a dotted key and nested) with two values"
            )
        else:
            old[name] = value
    return old, problems


def _legacy_agent(data: dict) -> dict:
    """``data`` with an old checkpoint's ``agent._target_`` (an rltrans class path) as its
    ``kind``; shallow copies only, so a hostile tree is never walked before its checks."""
    from rltrans.registry import legacy_agent_name

    agent = data.get("agent")
    if isinstance(agent, dict) and "_target_" in agent and "kind" not in agent:
        name = legacy_agent_name(agent["_target_"]) if isinstance(agent["_target_"], str) else None
        if name is not None:
            agent = {k: v for k, v in agent.items() if k != "_target_"}
            return {**data, "agent": {**agent, "kind": name}}
    return data


def checked_file_config(data: Any, source: str) -> DictConfig:
    """A train config read from ``source`` (a file), checked like a command line and with the
    defaults of keys it lacks; ConfigError lists every problem, each prefixed by ``source``."""
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise ConfigError(f"{source}: the config is {what}; not an rltrans config")
    data = _legacy_agent(data)
    problems = plain_problems(data)  # depth and size first: nothing deep is copied or walked
    if problems:
        raise ConfigError(format_problems([f"{source}: {p}" for p in problems]))
    data, problems = _expanded(data)  # a copy, with ``a.b: 1`` read as ``a: {b: 1}``
    if problems:
        raise ConfigError(format_problems([f"{source}: {p}" for p in problems]))
    # Trust comes from the command line of the process that runs, never from a file: a saved
    # ``trust_env_code: true`` is dropped here and takes its default (false).
    data.pop("trust_env_code", None)
    for group in _GROUPS:
        if group in data and not isinstance(data[group], dict):
            problems.append(f"{group}={data[group]!r}: expected a mapping {{key: value}}")
    if problems:
        raise ConfigError(format_problems([f"{source}: {p}" for p in problems]))
    base = _base(data)
    _fill_missing(data, base)
    cfg = OmegaConf.create(data)
    problems = check_config(cfg, OmegaConf.create(base), "train")
    if problems:
        raise ConfigError(format_problems([f"{source}: {p}" for p in problems]))
    return cfg


def read_run_config(path: Path) -> DictConfig:
    """A run folder's ``config.yaml``, checked (:func:`checked_file_config`)."""
    return checked_file_config(read_yaml(path), str(path))


# ----------------------------------------------------------------------------- code to import


def _trusted(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in TRUSTED_ROOTS)


def _split_path(path: str) -> tuple[str, str]:
    """``pkg.mod:Name`` or ``pkg.mod.Name`` -> (module, name)."""
    if ":" in path:
        module, _, name = path.partition(":")
        return module, name
    module, _, name = path.rpartition(".")
    return module, name


def env_code(env: Mapping[str, Any], key: str = "env") -> list[str]:
    """What building an env config would import or call beyond the trusted packages (an
    ``id`` with a module prefix, wrapper paths in either spelling, trusted wrappers that
    write files or open windows, a ``render_mode`` that opens a window), as ``key: what``
    lines; [] for none."""
    if not isinstance(env, Mapping):
        return []
    found = []
    kwargs = env.get("kwargs")
    mode = kwargs.get("render_mode") if isinstance(kwargs, Mapping) else None
    if mode not in QUIET_RENDER_MODES:
        found.append(f"{key}.kwargs.render_mode: {mode!r} (opens windows)")
    if env.get("kind") != "gym":
        return found
    env_id = str(env.get("id") or "")
    if ":" in env_id and not _trusted(env_id.split(":", 1)[0]):
        found.append(f"{key}.id: module {env_id.split(':', 1)[0]!r}")
    for i, entry in enumerate(env.get("wrappers") or []):
        path = str(entry.get("path", "")) if isinstance(entry, Mapping) else str(entry)
        module, name = _split_path(path)
        if not _trusted(module):
            found.append(f"{key}.wrappers[{i}].path: {path!r}")
        elif name in SIDE_EFFECT_WRAPPERS:
            found.append(f"{key}.wrappers[{i}].path: {path!r} (writes files or opens windows)")
    return found


def refuse_env_code(
    env: Mapping[str, Any],
    source: str,
    trust: bool,
    key: str = "env",
    typed: Mapping[str, Any] | None = None,
) -> None:
    """Raise ConfigError when an env config read from ``source`` names code (:func:`env_code`)
    and the user did not pass ``trust_env_code=true``; code that the env config the user
    ``typed`` on the command line names too is the user's own choice."""
    own = set(env_code(typed, key)) if typed is not None else set()
    found = [line for line in env_code(env, key) if line not in own]
    if found and not trust:
        raise ConfigError(
            f"{source} names code to import ({'; '.join(found)}); rltrans runs no code named "
            f"by a file. If you trust it, pass trust_env_code=true"
        )


__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "QUIET_RENDER_MODES",
    "SIDE_EFFECT_WRAPPERS",
    "TRUSTED_ROOTS",
    "checked_file_config",
    "env_code",
    "plain_problems",
    "read_run_config",
    "read_yaml",
    "refuse_env_code",
]
