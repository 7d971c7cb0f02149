"""Typed backbone specs: one frozen value per backbone family, and the one way to build it.

A spec holds what a backbone is, and only what applies to its family, so an option that a
family does not take cannot be written down: an :class:`RNNSpec` has no heads and no position
scheme, a :class:`UniversalSpec` no layers (its depth is ``max_steps``), an :class:`MLPSpec`
no memory. Each spec checks its values when it is made, so a spec that exists builds.

* :class:`StackSpec`: GTrXL, TrXL, TrXL-I (:mod:`rltrans.backbones.gtrxl`), a BlockConfig,
  Y layers, M steps of memory and the training ``chunk``;
* :class:`UniversalSpec`: the Universal Transformer (:mod:`rltrans.backbones.universal`), a
  BlockConfig, M and its halting options;
* :class:`RNNSpec` (LSTM or GRU) and :class:`MLPSpec` (the memoryless control);
* :class:`CausalSpec`: the Decision Transformer's GPT-2 stack (:mod:`rltrans.backbones.causal`).

:func:`backbone_spec` turns the keywords of an agent config (``backbone: gtrxl``, ``dim``,
``position``, ...) into a spec with the same checks and messages as ever, and
:func:`build` makes the module. A spec's :meth:`~StackSpec.keywords` goes back: the agent
keywords that give the same spec.

>>> from rltrans.core.block import BlockConfig
>>> spec = StackSpec(BlockConfig(dim=32, heads=4), memory=8, layers=2)
>>> spec == backbone_spec("gtrxl", 32, 2, 4, 8)
True
>>> build(spec).layers
2
>>> backbone_spec("lstm", 32, None, 4, 8, position="xl")
Traceback (most recent call last):
...
ValueError: options ['position'] only apply to transformer backbones, not 'lstm'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from rltrans.backbones.base import Backbone
from rltrans.backbones.causal import INITS, Init, causal_stack
from rltrans.backbones.gtrxl import PRESETS, TransformerStack, check_stack_options, preset_config
from rltrans.backbones.rnn import CellKind, MLPBackbone, RNNBackbone
from rltrans.backbones.universal import UniversalTransformer, check_universal_options
from rltrans.choices import check_choice
from rltrans.core.act import HaltingName, check_halting
from rltrans.core.block import BlockConfig

__all__ = [
    "BACKBONES",
    "DEFAULT_HEADS",
    "DEFAULT_LAYERS",
    "DEFAULT_MEMORY",
    "STACK_OPTIONS",
    "UNIVERSAL_OPTIONS",
    "BackboneName",
    "BackboneSpec",
    "CausalSpec",
    "DTBackboneSpec",
    "MLPSpec",
    "RNNSpec",
    "StackSpec",
    "UniversalSpec",
    "backbone_spec",
    "build",
    "check_keywords",
]

BackboneName = Literal["gtrxl", "trxl", "trxl_i", "universal", "lstm", "gru", "mlp"]
BACKBONES: tuple[str, ...] = get_args(BackboneName)
CELLS: tuple[str, ...] = get_args(CellKind)
DEFAULT_LAYERS = 3  # Y of the stacked backbones when ``layers`` is not given
DEFAULT_HEADS = 4  # H where an agent gives none
DEFAULT_MEMORY = 64  # M where an agent gives none


def _check_block(owner: str, block: Any) -> None:
    """Refuse a block that is not a BlockConfig (a dict of options, say)."""
    if not isinstance(block, BlockConfig):
        raise TypeError(f"{owner}.block must be a BlockConfig, got {type(block).__name__}")


def _block_keywords(block: BlockConfig) -> dict[str, Any]:
    """A BlockConfig's fields (dim and heads too) as agent keywords."""
    return {f.name: getattr(block, f.name) for f in dataclasses.fields(block)}


@dataclass(frozen=True)
class StackSpec:
    """A stack of ``layers`` TransformerBlocks built from ``block`` with ``memory`` M steps of
    segment memory; training segments longer than ``chunk`` steps run chunk by chunk (None:
    whole). GTrXL, TrXL and TrXL-I are blocks (:data:`rltrans.backbones.gtrxl.PRESETS`)."""

    block: BlockConfig
    memory: int
    layers: int = DEFAULT_LAYERS
    chunk: int | None = None

    def __post_init__(self) -> None:
        _check_block("StackSpec", self.block)
        check_stack_options(self.block, self.memory, self.chunk)

    @property
    def dim(self) -> int:
        """Model width D."""
        return self.block.dim

    @property
    def preset(self) -> str | None:
        """The preset (gtrxl, trxl, trxl_i) whose norm, sublayer activation and gate the block
        has, or None."""
        mine = {k: getattr(self.block, k) for k in ("norm", "sublayer_activation", "gate")}
        for name, options in PRESETS.items():
            if all(options[k] == v for k, v in mine.items()):
                return name
        return None

    def keywords(self) -> dict[str, Any]:
        """The agent keywords (``backbone``, ``dim``, ...) that :func:`backbone_spec` turns
        into this spec."""
        name = self.preset or "gtrxl"  # every block option is listed, so any preset rebuilds it
        own = {"backbone": name, "layers": self.layers, "memory": self.memory}
        return {**own, **_block_keywords(self.block), "chunk": self.chunk}

    def build(self) -> TransformerStack:
        """The stack."""
        return TransformerStack(self.block, self.layers, memory=self.memory, chunk=self.chunk)


@dataclass(frozen=True)
class UniversalSpec:
    """One shared block built from ``block``, applied up to ``max_steps`` times with ACT
    (Dehghani et al. 2019), ``memory`` M steps per depth step. ``halting``, ``act_epsilon``,
    ``halting_bias`` and ``coordinate_scale`` are the options of
    :class:`rltrans.backbones.universal.UniversalTransformer`, with its defaults."""

    block: BlockConfig
    memory: int
    max_steps: int = 6
    halting: HaltingName = "act"
    act_epsilon: float = 0.01
    halting_bias: float = -1.0
    coordinate_scale: float = 1.0

    def __post_init__(self) -> None:
        _check_block("UniversalSpec", self.block)
        check_universal_options(self.block, self.memory, self.coordinate_scale)
        check_halting(self.halting, self.max_steps, self.act_epsilon)

    @property
    def dim(self) -> int:
        """Model width D."""
        return self.block.dim

    def keywords(self) -> dict[str, Any]:
        """The agent keywords that :func:`backbone_spec` turns into this spec."""
        halting = {name: getattr(self, name) for name in UNIVERSAL_OPTIONS}
        own = {"backbone": "universal", "memory": self.memory}
        return {**own, **_block_keywords(self.block), **halting}

    def build(self) -> UniversalTransformer:
        """The Universal Transformer."""
        options = {name: getattr(self, name) for name in UNIVERSAL_OPTIONS}
        return UniversalTransformer(self.block, memory=self.memory, **options)


@dataclass(frozen=True)
class RNNSpec:
    """A ``layers``-deep LSTM or GRU (``cell``) of width ``dim``."""

    dim: int
    cell: CellKind = "lstm"
    layers: int = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        check_choice("recurrent cell", self.cell, CELLS)

    def keywords(self) -> dict[str, Any]:
        """The agent keywords that :func:`backbone_spec` turns into this spec."""
        return {"backbone": self.cell, "dim": self.dim, "layers": self.layers}

    def build(self) -> RNNBackbone:
        """The recurrent backbone."""
        return RNNBackbone(self.dim, self.layers, cell=self.cell)


@dataclass(frozen=True)
class MLPSpec:
    """The memoryless control: ``layers`` Linear + tanh layers of width ``dim``."""

    dim: int
    layers: int = DEFAULT_LAYERS

    def keywords(self) -> dict[str, Any]:
        """The agent keywords that :func:`backbone_spec` turns into this spec."""
        return {"backbone": "mlp", "dim": self.dim, "layers": self.layers}

    def build(self) -> MLPBackbone:
        """The MLP."""
        return MLPBackbone(self.dim, self.layers)


@dataclass(frozen=True)
class CausalSpec:
    """The Decision Transformer's causal stack without memory: ``layers`` blocks built from
    ``block`` (usually :func:`rltrans.backbones.causal.gpt2_config`), GPT-2 initialised unless
    ``init="torch"``."""

    block: BlockConfig
    layers: int = DEFAULT_LAYERS
    init: Init = "gpt2"

    def __post_init__(self) -> None:
        _check_block("CausalSpec", self.block)
        check_choice("init", self.init, INITS)
        if not self.block.causal:
            raise ValueError("causal_stack needs BlockConfig.causal=True")

    @property
    def dim(self) -> int:
        """Model width D."""
        return self.block.dim

    def build(self) -> TransformerStack:
        """The causal stack."""
        return causal_stack(self.block, self.layers, init=self.init)


BackboneSpec = StackSpec | UniversalSpec | RNNSpec | MLPSpec  # a memory policy's backbone
DTBackboneSpec = CausalSpec | UniversalSpec  # the Decision Transformer's
# Options of the Universal Transformer beyond its BlockConfig (its depth loop and halting).
UNIVERSAL_OPTIONS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(UniversalSpec) if f.name not in ("block", "memory")
)
# Options of the transformer stacks beyond their BlockConfig (how a training segment runs).
STACK_OPTIONS: tuple[str, ...] = ("chunk",)


def build(spec: BackboneSpec | DTBackboneSpec) -> Backbone:
    """The backbone module a spec describes."""
    return spec.build()


def backbone_spec(
    name: BackboneName,
    dim: int,
    layers: int | None = None,
    heads: int = DEFAULT_HEADS,
    memory: int = DEFAULT_MEMORY,
    **options: Any,
) -> BackboneSpec:
    """The spec of an agent's backbone keywords: BlockConfig options (position, gate, ...),
    the stacks' ``chunk`` and the Universal Transformer's halting options go in options.

    ``universal`` takes no ``layers``: one shared block is applied up to ``max_steps`` times
    (Dehghani et al. 2019), so ``max_steps`` is its depth. ``lstm``, ``gru`` and ``mlp``
    ignore ``heads`` and ``memory`` (agent configs carry them for every backbone).
    """
    check_choice("backbone", name, BACKBONES)
    block, rest = BlockConfig.split(options)
    if name == "universal":
        if layers is not None:
            raise ValueError(
                "backbone 'universal' has no layers: one shared block is applied up to "
                "max_steps times; set max_steps instead"
            )
        unknown = sorted(set(rest) - set(UNIVERSAL_OPTIONS))
        if unknown:
            raise ValueError(f"unknown options {unknown} for backbone 'universal'")
        config = BlockConfig(dim=dim, heads=heads, **block)  # defaults: a GTrXL block
        return UniversalSpec(config, memory=memory, **rest)
    layers = DEFAULT_LAYERS if layers is None else layers
    if name in PRESETS:
        chunk = rest.pop(STACK_OPTIONS[0], None)
        if rest:
            raise ValueError(f"options {sorted(rest)} do not apply to backbone {name!r}")
        config = preset_config(name, dim, heads, **block)
        return StackSpec(config, memory=memory, layers=layers, chunk=chunk)
    if options:
        raise ValueError(
            f"options {sorted(options)} only apply to transformer backbones, not {name!r}"
        )
    if name in CELLS:
        return RNNSpec(dim, cell=name, layers=layers)
    return MLPSpec(dim, layers=layers)


def check_keywords(spec: BackboneSpec, given: Mapping[str, Any]) -> None:
    """Refuse keywords given next to ``spec`` that it has no field for or holds otherwise.

    A keyword equal to the spec's value agrees with it and passes.
    """
    have = spec.keywords()
    kind = type(spec).__name__
    foreign = sorted(k for k in given if k not in have)
    if foreign:
        raise ValueError(
            f"options {foreign} do not apply to a {kind} (backbone={kind}(...)); its "
            f"options: {', '.join(k for k in have if k != 'backbone')}"
        )
    clashes = [f"{k}={v!r} (the spec: {k}={have[k]!r})" for k, v in given.items() if have[k] != v]
    if clashes:
        raise ValueError(
            f"backbone={kind}(...) conflicts with {', '.join(clashes)}: give each option once, "
            f"in the spec, or as keywords with backbone={have['backbone']!r}"
        )
