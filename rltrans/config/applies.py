"""Options that apply only under another choice: a knob given where it would do nothing is
an error naming it, not a silent no-op.

``agent.compressed_slots=64`` with ``agent.long_memory=linear`` would build a model that
never reads it; a user who typed it expects an effect. Only keys the command line sets are
checked: the shipped YAML carries every knob with a default, whatever the choices.

>>> from omegaconf import OmegaConf
>>> cfg = OmegaConf.create({"agent": {"kind": "memory", "backbone": "gtrxl",
...                                   "long_memory": "none", "compressed_slots": 64}})
>>> problem, = inapplicable(cfg, ["agent.compressed_slots"])
>>> problem.split(": ")[1]
'it applies only with agent.long_memory=compressive'
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from rltrans.config.spec import format_value
from rltrans.core.long_memory import RETAINING

# Backbone families of the memory agent (agents/memory_agent.py builds them): attention stacks
# with a window of memory (WINDOWED fits agent.horizon), the Universal Transformer, recurrent.
WINDOWED = ("gtrxl", "trxl", "trxl_i")
STACKS = (*WINDOWED, "universal")
RECURRENT = ("lstm", "gru")
GATES_WITH_BIAS = ("output", "highway", "sigmoid_tanh", "gru")


@dataclass(frozen=True)
class Rule:
    """``key`` applies only where the config's ``when`` key holds one of ``values``."""

    when: str
    values: tuple[object, ...]
    scope: Callable[[DictConfig], bool] = lambda cfg: True  # where the rule is checked at all

    def describe(self) -> str:
        """``agent.long_memory=compressive`` / ``agent.backbone in gtrxl, trxl, ...``."""
        shown = [format_value(v) for v in self.values]
        if len(shown) == 1:
            return f"{self.when}={shown[0]}"
        return f"{self.when} in {', '.join(shown)}"


def _memory_agent(cfg: DictConfig) -> bool:
    return OmegaConf.select(cfg, "agent.kind") == "memory"


def _stack(cfg: DictConfig) -> bool:
    return _memory_agent(cfg) and OmegaConf.select(cfg, "agent.backbone") in STACKS


_STACK_ONLY = Rule("agent.backbone", STACKS, _memory_agent)
_SEQUENCE = Rule("agent.backbone", (*WINDOWED, *RECURRENT), _memory_agent)
_ONLINE = Rule("algo.kind", ("online", "impala"))
_OFFLINE = Rule("algo.kind", ("offline",))

RULES: dict[str, Rule] = {
    "agent.heads": _STACK_ONLY,
    "agent.memory": _STACK_ONLY,
    "agent.long_memory": _STACK_ONLY,
    "agent.position": _STACK_ONLY,
    "agent.gate": _STACK_ONLY,
    "agent.chunk": _STACK_ONLY,
    "agent.adaptive_span": _STACK_ONLY,
    "agent.horizon": _SEQUENCE,
    "agent.compressed_slots": Rule("agent.long_memory", ("compressive",), _stack),
    "agent.compression_rate": Rule("agent.long_memory", ("compressive",), _stack),
    "agent.retention_scale": Rule("agent.long_memory", RETAINING, _stack),
    "agent.span_ramp": Rule("agent.adaptive_span", (True,), _stack),
    "agent.span_coef": Rule("agent.adaptive_span", (True,), _stack),
    "agent.gate_bias": Rule("agent.gate", GATES_WITH_BIAS, _stack),
    "agent.shaw_max_distance": Rule("agent.position", ("shaw",), _stack),
    "agent.max_len": Rule("agent.position", ("learned",), _stack),
    # train.yaml's budgets and data belong to one kind of training each
    "total_steps": _ONLINE,
    "train_steps": _OFFLINE,
    "dataset": _OFFLINE,
    "dataset_kind": _OFFLINE,
    # PPO's own rollout (IMPALA's actors step their envs through the generic loop)
    "rollout": Rule("algo.kind", ("online",)),
    # where IMPALA's actors run: the group and every key below it
    "runtime": Rule("algo.kind", ("impala",)),
}


def inapplicable(cfg: DictConfig, given: Collection[str]) -> list[str]:
    """One line per key in ``given`` (keys the command line set) that does nothing under the
    config's other choices (:data:`RULES`; a group's rule covers the keys below it)."""
    problems = []
    for key in dict.fromkeys(given):
        rule = RULES.get(key) or RULES.get(key.split(".")[0])
        if rule is None or not rule.scope(cfg):
            continue
        if OmegaConf.select(cfg, key, default=None) is None:
            continue  # removed (~key) or null: nothing was asked of it
        current = OmegaConf.select(cfg, rule.when, default=None)
        if current in rule.values:
            continue
        value = OmegaConf.select(cfg, key)
        if isinstance(value, DictConfig):  # a group's choice (runtime=process): its kind
            value = value.get("kind", key)
        problems.append(
            f"{key}={format_value(value)} does nothing with {rule.when}={format_value(current)}: "
            f"it applies only with {rule.describe()}"
        )
    return problems


__all__ = ["GATES_WITH_BIAS", "RECURRENT", "RULES", "STACKS", "WINDOWED", "Rule", "inapplicable"]
