"""Typed backbone specs: the keywords of an agent config become the spec written by hand,
the spec goes back to the same keywords, its defaults are the modules', options a family does
not take have no field, and every value a module refuses is refused when the spec is made,
with the message the keyword path has always given."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest
import torch

from rltrans.backbones.causal import gpt2_config
from rltrans.backbones.gtrxl import PRESETS, TransformerStack
from rltrans.backbones.rnn import MLPBackbone, RNNBackbone
from rltrans.backbones.spec import (
    BACKBONES,
    UNIVERSAL_OPTIONS,
    CausalSpec,
    MLPSpec,
    RNNSpec,
    StackSpec,
    UniversalSpec,
    backbone_spec,
    build,
    check_keywords,
)
from rltrans.backbones.universal import UniversalTransformer
from rltrans.core.block import BlockConfig

D, H, M = 32, 4, 8
TRXL = {"norm": "post", "sublayer_activation": "none", "gate": "residual"}
TRXL_I = {"gate": "residual"}  # pre-norm, ReLU: the BlockConfig defaults

# (name, layers, heads, memory, options) -> the spec written out by hand
CASES = [
    (("gtrxl", None, H, M, {}), StackSpec(BlockConfig(D, H), memory=M)),
    (("trxl", None, H, M, {}), StackSpec(BlockConfig(D, H, **TRXL), memory=M)),
    (("trxl_i", None, H, M, {}), StackSpec(BlockConfig(D, H, **TRXL_I), memory=M)),
    (
        ("gtrxl", 2, H, M, {"position": "rotary", "gate": "highway", "chunk": 4}),
        StackSpec(BlockConfig(D, H, position="rotary", gate="highway"), M, layers=2, chunk=4),
    ),
    (
        ("trxl", 1, 2, M, {"long_memory": "mixed", "ff_activation": "relu", "dropout": 0.1}),
        StackSpec(
            BlockConfig(D, 2, long_memory="mixed", ff_activation="relu", dropout=0.1, **TRXL),
            memory=M,
            layers=1,
        ),
    ),
    (
        ("trxl_i", 2, 2, M, {"adaptive_span": True, "span_ramp": 4}),
        StackSpec(BlockConfig(D, 2, adaptive_span=True, span_ramp=4, **TRXL_I), memory=M, layers=2),
    ),
    (("universal", None, H, M, {}), UniversalSpec(BlockConfig(D, H), memory=M)),
    (
        ("universal", None, 2, 0, {"max_steps": 3, "halting": "none", "position": "sinusoidal"}),
        UniversalSpec(
            BlockConfig(D, 2, position="sinusoidal"), memory=0, max_steps=3, halting="none"
        ),
    ),
    (
        (
            "universal",
            None,
            H,
            M,
            {"act_epsilon": 0.05, "halting_bias": 0.5, "coordinate_scale": 0.1},
        ),
        UniversalSpec(
            BlockConfig(D, H), memory=M, act_epsilon=0.05, halting_bias=0.5, coordinate_scale=0.1
        ),
    ),
    (("lstm", None, H, M, {}), RNNSpec(D)),  # heads and memory: carried by configs, unused
    (("lstm", 1, 1, 0, {}), RNNSpec(D, layers=1)),
    (("gru", 2, H, M, {}), RNNSpec(D, cell="gru", layers=2)),
    (("mlp", None, 1, 0, {}), MLPSpec(D)),
    (("mlp", 1, H, M, {}), MLPSpec(D, layers=1)),
]
IDS = [f"{name}-{i}" for i, ((name, *_), _) in enumerate(CASES)]


def test_every_backbone_name_has_a_case():
    assert {name for (name, *_), _ in CASES} == set(BACKBONES)


@pytest.mark.parametrize(("keywords", "spec"), CASES, ids=IDS)
def test_keywords_give_the_spec_written_by_hand(keywords, spec):
    name, layers, heads, memory, options = keywords
    assert backbone_spec(name, D, layers, heads, memory, **options) == spec


@pytest.mark.parametrize(("keywords", "spec"), CASES, ids=IDS)
def test_a_spec_goes_back_to_keywords_that_give_it(keywords, spec):
    words = spec.keywords()
    assert backbone_spec(words.pop("backbone"), **words) == spec
    assert words["dim"] == spec.dim


@pytest.mark.parametrize(("keywords", "spec"), CASES, ids=IDS)
def test_a_spec_builds_its_module(keywords, spec):
    module = build(spec)
    kind = {StackSpec: TransformerStack, UniversalSpec: UniversalTransformer}
    kind |= {RNNSpec: RNNBackbone, MLPSpec: MLPBackbone}
    assert type(module) is kind[type(spec)] and module.dim == spec.dim
    if isinstance(spec, StackSpec | UniversalSpec):
        assert module.config is spec.block and module.memory == spec.memory
    if isinstance(spec, StackSpec):
        assert (module.layers, module.chunk) == (spec.layers, spec.chunk)
    if isinstance(spec, UniversalSpec):
        assert module.max_steps == spec.max_steps
    if isinstance(spec, RNNSpec):
        assert (module.cell, module.layers) == (spec.cell, spec.layers)


def test_the_presets_are_recognised_from_the_block():
    for name, options in PRESETS.items():
        assert StackSpec(BlockConfig(D, H, **options), memory=M).preset == name
    odd = StackSpec(BlockConfig(D, H, norm="post"), memory=M)  # post-norm with a GRU gate
    assert odd.preset is None and odd.keywords()["backbone"] == "gtrxl"


def test_spec_defaults_are_the_modules_and_the_agents():
    """A spec left at its defaults builds what the keyword path builds when they are left out."""
    ut = inspect.signature(UniversalTransformer.__init__).parameters
    assert {o: ut[o].default for o in UNIVERSAL_OPTIONS} == {
        o: getattr(UniversalSpec(BlockConfig(D, H), memory=M), o) for o in UNIVERSAL_OPTIONS
    }
    assert backbone_spec("gtrxl", D) == StackSpec(BlockConfig(D, 4), memory=64, layers=3)
    assert backbone_spec("lstm", D) == RNNSpec(D, cell="lstm", layers=3)
    assert backbone_spec("mlp", D) == MLPSpec(D, layers=3)


def test_options_a_family_does_not_take_have_no_field():
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (RNNSpec, MLPSpec)}
    assert names[RNNSpec] == {"dim", "cell", "layers"} and names[MLPSpec] == {"dim", "layers"}
    assert "layers" not in {f.name for f in dataclasses.fields(UniversalSpec)}
    with pytest.raises(TypeError):
        RNNSpec(D, heads=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        UniversalSpec(BlockConfig(D, H), memory=M, layers=2)  # type: ignore[call-arg]


@pytest.mark.parametrize(("keywords", "spec"), CASES[::4], ids=IDS[::4])
def test_specs_are_frozen_values_that_copy_and_pickle(keywords, spec):
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.dim = 64  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(spec)) == spec == copy.deepcopy(spec)
    assert hash(spec) == hash(copy.deepcopy(spec))


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        (("universe", D, None, H, M), {}, r"unknown backbone 'universe'; valid choices: gtrxl"),
        (("universal", D, 2, H, M), {}, r"has no layers: one shared .* set max_steps instead"),
        (("universal", D, None, H, M), {"layer": 3}, r"unknown options \['layer'\] for .*'uni"),
        (("gtrxl", D, 1, H, M), {"max_steps": 3}, r"options \['max_steps'\] do not apply to"),
        (("lstm", D, None, H, M), {"position": "xl"}, r"only apply to transformer .*, not 'lstm'"),
        (("mlp", D, None, H, M), {"chunk": 4}, r"only apply to transformer .*, not 'mlp'"),
        (("trxl", D, 1, H, M), {"gate": "lstm"}, r"BlockConfig.gate: unknown gate 'lstm'"),
        (("gtrxl", D, 1, H, 0), {"long_memory": "linear"}, r"needs memory >= 1, got 0"),
        (("gtrxl", D, 1, H, M), {"chunk": 0}, r"chunk must be >= 1 or None, got 0"),
        (("universal", D, None, H, M), {"long_memory": "linear"}, r"takes long_memory=none"),
        (("universal", D, None, H, M), {"adaptive_span": True}, r"takes adaptive_span=false"),
        (("universal", D, None, H, M), {"halting": "never"}, r"unknown halting 'never'"),
        (("universal", D, None, H, M), {"max_steps": 0}, r"max_steps must be >= 1, got 0"),
        (("universal", D, None, H, M), {"act_epsilon": 1.0}, r"act epsilon must be in \(0, 1\)"),
        (("universal", D, None, H, -1), {}, r"memory must be >= 0, got -1"),
        (("universal", D, None, H, M), {"coordinate_scale": -1}, r"coordinate_scale must be >= 0"),
    ],
)
def test_the_keyword_path_refuses_as_it_always_has(args, options, match):
    with pytest.raises(ValueError, match=match):
        backbone_spec(*args, **options)


def test_a_spec_refuses_when_it_is_made_not_when_it_is_built():
    with pytest.raises(ValueError, match="unknown recurrent cell 'rnn'"):
        RNNSpec(D, cell="rnn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"adaptive_span .* needs memory >= 1, got 0"):
        StackSpec(BlockConfig(D, H, adaptive_span=True), memory=0)
    with pytest.raises(ValueError, match="causal_stack needs BlockConfig.causal=True"):
        CausalSpec(gpt2_config(D, 1, causal=False))
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        CausalSpec(gpt2_config(D, 1), init="xavier")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StackSpec.block must be a BlockConfig, got dict"):
        StackSpec({"dim": D, "heads": H}, memory=M)  # type: ignore[arg-type]


def test_keywords_next_to_a_spec_must_agree_with_it():
    spec = StackSpec(BlockConfig(D, H, position="rotary"), memory=M, layers=2)
    check_keywords(spec, {"dim": D, "layers": 2, "position": "rotary"})  # the same values
    with pytest.raises(ValueError, match=r"conflicts with dim=64 \(the spec: dim=32\)"):
        check_keywords(spec, {"dim": 64})
    with pytest.raises(ValueError, match=r"layers=3 \(the spec: layers=2\), position='xl'"):
        check_keywords(spec, {"layers": 3, "position": "xl"})
    with pytest.raises(ValueError, match=r"options \['max_steps'\] do not apply to a StackSpec"):
        check_keywords(spec, {"max_steps": 3})
    with pytest.raises(ValueError, match=r"options \['heads', 'memory'\] do not apply to a RNN"):
        check_keywords(RNNSpec(D), {"heads": 4, "memory": 0})


# ------------------------------------------------------------- the Decision Transformer's


@pytest.mark.parametrize("init", ["gpt2", "torch"])
def test_a_causal_spec_builds_the_causal_stack(init):
    from rltrans.backbones.causal import causal_stack

    config = gpt2_config(D, 2, max_len=30)
    torch.manual_seed(0)
    want = causal_stack(config, 2, init=init).state_dict()
    torch.manual_seed(0)
    got = build(CausalSpec(config, layers=2, init=init)).state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
