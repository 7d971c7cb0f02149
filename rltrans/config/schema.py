"""Typed schema of the composed configs: what every key accepts, checked before a run builds
anything.

A key's type comes from its YAML default (``dim: 64`` takes integers, ``amp: false`` takes
true/false); the tables of :mod:`rltrans.config.keys` add what a default cannot say: ranges,
choices and null. Two mappings take keyword arguments
rather than fixed keys: ``env.kwargs`` (any key for Gymnasium ids; a torch env's
constructor arguments) and ``agent.encoder`` (``build_encoder``'s arguments).

:func:`check_config` reports every bad key of a composed config at once, one line each
naming the key, the bad value and what is valid; :func:`rltrans.config.compose.load_config`
raises them as one ConfigError.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rltrans.config.files import group_kinds
from rltrans.config.keys import MAX_LENGTH, MAX_SPACE_SIZE, MAX_STEPS, specs
from rltrans.config.resources import memory_estimate as memory_estimate  # older imports
from rltrans.config.resources import physical_memory as physical_memory
from rltrans.config.resources import wrapper_problems
from rltrans.config.spec import (
    Spec,
    bad_value,
    hint_spec,
    infer_spec,
    unknown_key,
)

_MISSING = object()


# ----------------------------------------------------------------- keyword-argument mappings


def _env_kwargs(cfg: dict) -> dict[str, Spec | None] | None:
    """env.kwargs: a torch env's constructor arguments; anything for Gymnasium ids (None)."""
    env = cfg.get("env") or {}
    if env.get("kind") != "torch":
        return None
    from rltrans.envs.torch_envs import TORCH_ENVS, env_kwargs

    if env.get("name") not in TORCH_ENVS:
        return None  # env.name itself is reported
    hints = typing.get_type_hints(TORCH_ENVS[env["name"]].__init__)
    return {k: hint_spec(hints.get(k)) for k in env_kwargs(env["name"])}


def _encoder_kwargs(cfg: dict) -> dict[str, Spec | None] | None:
    """agent.encoder: the keyword arguments of build_encoder."""
    from rltrans.agents.encoders import build_encoder

    hints = typing.get_type_hints(build_encoder)
    params = inspect.signature(build_encoder).parameters.values()
    return {p.name: hint_spec(hints.get(p.name)) for p in params if p.kind is p.KEYWORD_ONLY}


KEYWORD_MAPPINGS: dict[str, dict[str, Callable[[dict], dict[str, Spec | None] | None]]] = {
    "train": {"env.kwargs": _env_kwargs, "agent.encoder": _encoder_kwargs},
}


def keyword_mappings(config_name: str) -> list[str]:
    """Keys whose mapping takes keyword arguments (new keys allowed) rather than fixed keys."""
    return list(KEYWORD_MAPPINGS.get(config_name, {}))


# ----------------------------------------------------------------------------- checking


class _Checker:
    """One pass over a composed config (plain containers), collecting problems and fixes."""

    def __init__(self, config_name: str, data: dict, base: dict) -> None:
        self.name, self.data, self.base = config_name, data, base
        self.table = specs(config_name)
        self.problems: list[str] = []
        self.fixes: dict[str, Any] = {}
        self.seen: dict[str, Spec | None] = {}  # every key checked, with its spec
        self.bad: set[str] = set()  # keys already reported (cross checks skip them)

    def spec(self, key: str, default: Any) -> Spec | None:
        """Explicit spec (kind-qualified first), else the default's type."""
        section = self.data.get(key.split(".")[0])
        kind = section.get("kind") if isinstance(section, dict) and "." in key else None
        found = self.table.get(f"{key}@{kind}") or self.table.get(key)
        if found is None:
            return None if default is _MISSING else infer_spec(default)
        if isinstance(default, str) and default in found.default_words:
            return replace(found, words=(*found.words, default))
        return found

    def leaf(self, key: str, value: Any, spec: Spec, node: dict, name: str) -> None:
        """Check one value; record its canonical form."""
        self.seen[key] = spec
        ok, fixed = spec.check(value)
        if not ok:
            self.bad.add(key)
            self.problems.append(bad_value(key, value, spec))
        elif fixed != value or type(fixed) is not type(value):  # 1e5 -> 100000, 3 -> 3.0
            node[name] = self.fixes[key] = fixed

    def walk(self, node: dict, base: Any, prefix: str) -> None:
        """Check every key below ``node`` against ``base`` (the defaults at the same place)."""
        keywords = KEYWORD_MAPPINGS.get(self.name, {})
        for name, value in node.items():
            key = f"{prefix}{name}"
            default = base.get(name, _MISSING) if isinstance(base, dict) else _MISSING
            spec = self.spec(key, default)
            if isinstance(value, str) and value == "???":  # OmegaConf's missing value
                self.bad.add(key)
                self.problems.append(f"{key}='???': a missing value; give it a value")
            elif key in keywords:
                self.keywords(key, value, default, keywords[key](self.data))
            elif isinstance(default, dict) and (spec is None or spec.type == "mapping"):
                if isinstance(value, dict):
                    self.walk(value, default, key + ".")
                else:
                    self.bad.add(key)
                    self.problems.append(bad_value(key, value, Spec("mapping")))
            elif spec is not None:
                self.leaf(key, value, spec, node, name)
            elif default is _MISSING and self.agent_takes(key):  # +agent.<its argument>=...
                self.leaf(key, value, Spec("any"), node, name)
            elif default is _MISSING:
                self.problems.append(unknown_key(key, base if isinstance(base, dict) else []))
            else:
                self.seen[key] = None  # a null default without a table entry (a test forbids it)
        # ~key removed a key the code reads; agent knobs fall back to the builder's defaults.
        for name in base if isinstance(base, dict) and not prefix.startswith("agent.") else ():
            if name not in node and prefix + name not in keywords:
                self.problems.append(
                    f"config key {prefix + name!r} was removed (~{prefix + name}); the run reads "
                    f"it: give it a value instead ({self._describe(prefix + name, base[name])})"
                )

    def agent_takes(self, key: str) -> bool:
        """Whether ``key`` (``agent.<name>``) is a keyword argument of a registered agent
        class that its preset's YAML leaves out (a class with ``**knobs`` takes any name);
        the shipped ``memory`` kind's extra knobs are in the key tables instead."""
        agent = self.data.get("agent")
        if not key.startswith("agent.") or key.count(".") != 1 or not isinstance(agent, dict):
            return False
        if agent.get("kind") in (None, "memory", "dt", "bc") or _entry(agent["kind"]) is None:
            return False
        knobs = agent_knob_names(agent)
        return knobs is None or key.split(".")[1] in knobs

    def _describe(self, key: str, default: Any) -> str:
        """What a key accepts, for messages."""
        spec = self.spec(key, default)
        return spec.describe() if spec else "see --help"

    def keywords(self, key: str, value: Any, default: Any, valid: dict | None) -> None:
        """A keyword-argument mapping: known names (all, for None), typed where known."""
        self.seen[key] = Spec("mapping")
        if not isinstance(value, dict):
            self.bad.add(key)
            self.problems.append(bad_value(key, value, Spec("mapping")))
            return
        defaults = default if isinstance(default, dict) else {}
        for name, item in value.items():
            sub = f"{key}.{name}"
            if valid is not None and name not in valid:
                why = self._keyword_owner(key)
                self.problems.append(unknown_key(sub, valid, why))
                continue
            spec = self.spec(sub, defaults.get(name, _MISSING))
            if valid is not None and valid.get(name) is not None:
                spec = spec if self.table_has(sub) else valid[name]
            self.leaf(sub, item, spec or Spec("any"), value, name)

    def table_has(self, key: str) -> bool:
        """An explicit entry exists for ``key`` (plain or kind-qualified)."""
        return any(k == key or k.startswith(key + "@") for k in self.table)

    def _keyword_owner(self, key: str) -> str:
        """`` (not an argument of torch env 'tmaze')`` and the like."""
        if key == "env.kwargs":
            return f" (not an argument of torch env {self.data['env'].get('name')!r})"
        return " (not an argument of build_encoder)" if key == "agent.encoder" else ""


def check_config(cfg: DictConfig, defaults: DictConfig, config_name: str) -> list[str]:
    """Every problem of a composed config, one line each; numbers are put into their canonical
    type in place (total_steps=1e5 -> 100000). ``defaults`` is the config composed with the
    same group choices and no value overrides: it gives the types of the keys."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # a ${...} reference to nothing
        return [str(err).replace("\n   ", ";")]
    base = OmegaConf.to_container(defaults, resolve=True)
    checker = _Checker(config_name, data, base)  # type: ignore[arg-type]
    checker.walk(data, base, "")  # type: ignore[arg-type]
    problems = checker.problems
    if config_name == "train":
        problems += _train_cross_checks(data, checker.bad)  # type: ignore[arg-type]
    for key, value in checker.fixes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return problems


def config_specs(cfg: DictConfig, defaults: DictConfig, config_name: str) -> dict[str, Spec | None]:
    """The spec of every key of a composed config (None: a null default with no table entry)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    checker = _Checker(config_name, data, OmegaConf.to_container(defaults, resolve=True))  # type: ignore[arg-type]
    checker.walk(data, checker.base, "")
    return checker.seen


# ------------------------------------------------------------------------- cross checks


def _divides(small_key: str, small: Any, big_key: str, big: Any) -> list[str]:
    """``small`` must divide ``big`` (both integers already checked); the report lists the
    divisors."""
    if not (isinstance(small, int) and isinstance(big, int) and small > 0 and big % small):
        return []
    valid = ", ".join(str(n) for n in range(1, big + 1) if big % n == 0)
    return [f"{small_key}={small}: must divide {big_key}={big}; valid: {valid}"]


def _train_cross_checks(cfg: dict, bad: set[str]) -> list[str]:
    """Values that are fine alone but not together (each skipped when a part is already bad)."""
    from rltrans.backbones.gtrxl import PRESETS
    from rltrans.registry import registered_agents

    agent, algo, env = (cfg.get(k) or {} for k in ("agent", "algo", "env"))
    kind, backbone, algo_kind = agent.get("kind"), agent.get("backbone"), algo.get("kind")
    problems = []
    if not bad & {"agent.dim", "agent.heads"} and (
        kind == "dt" or (kind == "memory" and backbone in (*PRESETS, "universal"))
    ):
        problems += _divides("agent.heads", agent.get("heads"), "agent.dim", agent.get("dim"))
    if algo_kind in ("online", "impala") and not bad & {"algo.num_steps", "algo.segment_length"}:
        length, steps = algo.get("segment_length"), algo.get("num_steps")
        problems += _divides("algo.segment_length", length, "algo.num_steps", steps)
    if kind == "memory" and backbone == "universal" and agent.get("layers"):
        problems.append(
            f"agent.layers={agent['layers']}: backbone universal has no layers (one shared "
            "block looped agent.max_steps times); valid: null, or leave it out"
        )
    entry = None if bad & {"agent.kind", "agent.backbone"} else _entry(kind)
    knobs = agent_knob_names(agent) if entry is not None else None
    owner = f"backbone {backbone}" if kind == "memory" and backbone else f"agent.kind={kind}"
    for name in [n for n in agent if n not in knobs] if knobs is not None else ():
        problems.append(unknown_key(f"agent.{name}", knobs, f" (not a knob of {owner})"))
    problems = _transformer_preset_on_recurrent_backbone(agent, knobs, problems)
    problems += _minibatch_problems(cfg, bad)
    if "env.wrappers" not in bad:
        problems += wrapper_problems(env.get("wrappers"), MAX_LENGTH, MAX_STEPS, MAX_SPACE_SIZE)
    offline = algo_kind == "offline"
    # DT/BC (return-conditioned) train offline only, the PPO agents online only.
    mismatch = entry is not None and entry.return_conditioned != offline
    if mismatch and algo_kind and "algo.kind" not in bad:
        fits = [n for n in registered_agents() if _entry(n).return_conditioned == offline]
        problems.append(
            f"agent.kind={kind}: {'no' if offline else 'a'} return-conditioned agent, so it "
            f"does not train with algo.kind={algo_kind}; valid with algo.kind={algo_kind}: "
            f"{', '.join(fits)}"
        )
    if env.get("kind") == "dataset" and not offline and "algo.kind" not in bad:
        others = [k for k in group_kinds("env") if k != "dataset"]
        problems.append(
            f"env.kind=dataset: the dataset's own env is for algo.kind=offline (agent=dt or "
            f"agent=bc select both), not algo.kind={algo_kind}; valid with it: env.kind "
            f"{', '.join(others)}"
        )
    return problems


def _minibatch_problems(cfg: dict, bad: set[str]) -> list[str]:
    """algo.num_minibatches must not exceed what one update can split: PPO's segments
    (envs x num_steps / segment_length), IMPALA's envs per learner batch."""
    algo, env, runtime = (cfg.get(k) or {} for k in ("algo", "env", "runtime"))
    count, envs = algo.get("num_minibatches"), env.get("num_envs")
    keys = {"algo.num_minibatches", "algo.num_steps", "algo.segment_length", "env.num_envs"}
    if bad & keys or not isinstance(count, int) or not isinstance(envs, int):
        return []
    if algo.get("kind") == "online":
        parts = envs * algo["num_steps"] // algo["segment_length"]
        what = (
            f"the {parts} segments of an update (env.num_envs x algo.num_steps / "
            "algo.segment_length)"
        )
    elif algo.get("kind") == "impala" and not bad & {
        "algo.batch_rollouts",
        "runtime.envs_per_actor",
    }:
        per_rollout = envs
        if runtime.get("kind") != "local" and runtime.get("envs_per_actor"):
            per_rollout = runtime["envs_per_actor"]
        parts = algo["batch_rollouts"] * per_rollout
        what = f"the {parts} envs of a learner batch (algo.batch_rollouts x envs per rollout)"
    else:
        return []
    if count <= parts:
        return []
    return [f"algo.num_minibatches={count}: more than {what}; valid: 1..{parts}"]


# ------------------------------------- a transformer preset with agent.backbone=lstm|gru|mlp


def _transformer_preset_on_recurrent_backbone(
    agent: dict, knobs: list[str] | None, problems: list[str]
) -> list[str]:
    """``problems`` with the refusals of a transformer preset's block knobs merged into one
    line: ``agent.backbone=gru`` on the default agent (gtrxl) leaves position, gate, ... that
    a GRU does not take, each rightly refused; the fix is the backbone's own preset."""
    from dataclasses import fields

    from rltrans.backbones.gtrxl import PRESETS
    from rltrans.backbones.spec import STACK_OPTIONS
    from rltrans.config.files import group_options
    from rltrans.core.block import BlockConfig

    backbone = agent.get("backbone")
    if knobs is None or agent.get("kind") != "memory" or backbone in (*PRESETS, "universal"):
        return problems
    block = {f.name for f in fields(BlockConfig)} | set(STACK_OPTIONS)
    names = sorted(n for n in agent if n not in knobs and n in block)
    if not names:
        return problems
    why = f" (not a knob of backbone {backbone})"
    refused = {unknown_key(f"agent.{n}", knobs, why) for n in names}
    preset = f"agent={backbone}" if backbone in group_options("agent") else "an agent preset"
    line = (
        f"agent.backbone={backbone}: the agent preset's transformer knobs ({', '.join(names)}) "
        f"do not apply to backbone {backbone}; use {preset} instead of agent.backbone={backbone}"
    )
    return [line, *(p for p in problems if p not in refused)]


# ------------------------------------------------------------------------- end of that check


def _entry(name: Any) -> Any:
    """The registry entry of an agent name (None for an unknown one: agent.kind is reported)."""
    from rltrans.registry import RegistryError, agent_entry

    try:
        return agent_entry({"kind": name})
    except RegistryError:
        return None


def agent_knob_names(agent: dict) -> list[str] | None:
    """The keys an agent config may hold: its builder's keyword arguments, and for
    ``kind: memory`` the options its backbone takes (BlockConfig fields for transformer
    stacks, plus the halting options of ``universal``); None where that is open-ended."""
    from dataclasses import fields

    entry = _entry(agent.get("kind"))
    if entry is None:
        return None
    params = inspect.signature(entry.build).parameters
    # stats: the dataset statistics the trainer passes, never a config knob
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [n for n, p in params.items() if p.kind in keyword and p.default is not p.empty]
    knobs = ["kind", *(n for n in names if n not in ("observation_space", "action_space", "stats"))]
    if agent.get("kind") not in ("dt", "bc"):
        from rltrans.registry import PLAN_KNOBS

        knobs += [k for k in PLAN_KNOBS if k not in knobs]  # the plan reads it, not the class
    if agent.get("kind") == "memory":
        from rltrans.backbones.gtrxl import PRESETS
        from rltrans.backbones.spec import STACK_OPTIONS, UNIVERSAL_OPTIONS
        from rltrans.core.block import BlockConfig

        block = [f.name for f in fields(BlockConfig) if f.name not in knobs]
        backbone = agent.get("backbone", getattr(params.get("backbone"), "default", None))
        extra = {"universal": [*block, *UNIVERSAL_OPTIONS]}.get(
            backbone, [*block, *STACK_OPTIONS] * (backbone in PRESETS)
        )
        return knobs + extra
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return None if open_ended else knobs
