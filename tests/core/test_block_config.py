"""BlockConfig: one frozen record of the transformer options, validated once and passed whole
to the block and to every stack built from blocks."""

import dataclasses
import inspect

import pytest
import torch
from torch import nn

from rltrans.backbones.causal import causal_stack, gpt2_config
from rltrans.backbones.gtrxl import TransformerStack
from rltrans.backbones.universal import UniversalTransformer
from rltrans.core.block import BlockConfig, TransformerBlock, block_choices, build_block
from rltrans.core.gates import GATES
from rltrans.core.position import POSITIONS

FIELDS = {f.name for f in dataclasses.fields(BlockConfig)}
CONFIG = BlockConfig(
    dim=16,
    heads=2,
    position="rotary",
    gate="residual",
    norm="post",
    sublayer_activation="none",
    ff_mult=3,
    ff_activation="relu",
    dropout=0.1,
    attn_dropout=0.2,
    kernel="math",
    max_len=64,
)


def check_block(block: TransformerBlock, config: BlockConfig) -> None:
    """The block's modules are the ones ``config`` names."""
    assert block.attn.kernel == config.kernel and block.attn.dropout == config.attn_dropout
    assert type(block.attn.scheme).__name__ == "RotaryAttention"
    assert block.mlp.net[0].out_features == config.ff_mult * config.dim
    assert isinstance(block.mlp.net[1], nn.ReLU)
    assert type(block.gate1).__name__ == "ResidualGate" and isinstance(block.act, nn.Identity)
    assert block.drop.p == config.dropout
    assert block.norm == "post" and block.placement.attn_out is block.norm1


def test_the_config_is_passed_whole_to_every_constructor():
    check_block(build_block(CONFIG), CONFIG)
    stack = TransformerStack(CONFIG, layers=2, memory=4)
    ut = UniversalTransformer(CONFIG, max_steps=2, memory=4)
    gpt = causal_stack(CONFIG, layers=2, init="torch")
    for backbone in (stack, ut, gpt):
        assert backbone.config is CONFIG
        assert backbone.causal and (backbone.dim, backbone.heads) == (16, 2)
    for block in [*stack.blocks, ut.block, *gpt.blocks]:
        check_block(block, CONFIG)


@pytest.mark.parametrize("build", [TransformerBlock.__init__, TransformerStack.__init__,
                                   UniversalTransformer.__init__, causal_stack])  # fmt: skip
def test_no_constructor_redeclares_the_block_options(build):
    """Every constructor takes the BlockConfig, none of its fields as keywords."""
    params = set(inspect.signature(build).parameters)
    assert "config" in params and not params & FIELDS


@pytest.mark.parametrize("field", sorted(block_choices()))
def test_a_bad_choice_names_the_field_the_value_and_the_valid_ones(field):
    valid = block_choices()[field]
    assert getattr(BlockConfig(dim=8, heads=2), field) in valid  # the defaults are valid
    with pytest.raises(ValueError) as err:
        BlockConfig(dim=8, heads=2, **{field: "bogus"})
    message = str(err.value)
    assert f"BlockConfig.{field}" in message and "'bogus'" in message
    assert message.endswith(f"valid choices: {', '.join(valid)}")


def test_choices_are_the_literal_types():
    choices = block_choices()
    assert choices["position"] == POSITIONS and choices["gate"] == GATES
    assert choices["norm"] == ("pre", "post") and choices["kernel"] == ("sdpa", "math")
    assert choices["ff_activation"] == ("gelu", "relu")
    assert choices["sublayer_activation"] == ("relu", "none")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"heads": 3}, r"dim=8 must be divisible by BlockConfig.heads=3"),
        ({"ff_mult": 0}, r"BlockConfig.ff_mult must be >= 1"),
        ({"dropout": 1.0}, r"BlockConfig.dropout must be in \[0, 1\)"),
        ({"attn_dropout": -0.1}, r"BlockConfig.attn_dropout must be in \[0, 1\)"),
        ({"shaw_max_distance": 0}, r"BlockConfig.shaw_max_distance must be >= 1"),
        ({"max_len": 0}, r"BlockConfig.max_len must be >= 1"),
    ],
)
def test_bad_numbers_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        BlockConfig(**{"dim": 8, "heads": 2, **changes})


def test_the_config_is_frozen_and_replace_validates_again():
    config = BlockConfig(dim=8, heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gate = "residual"  # type: ignore[misc]
    assert config.replace(gate="residual").gate == "residual" and config.gate == "gru"
    with pytest.raises(ValueError, match="BlockConfig.gate: unknown gate 'lstm'"):
        config.replace(gate="lstm")
    assert BlockConfig.split({"gate": "gru", "max_steps": 3}) == ({"gate": "gru"}, {"max_steps": 3})


def test_gpt2_config_ties_attention_dropout_to_dropout_unless_given():
    assert gpt2_config(8, 1).attn_dropout == 0.1
    assert gpt2_config(8, 1, dropout=0.3).attn_dropout == 0.3
    assert gpt2_config(8, 1, dropout=0.3, attn_dropout=0.0).attn_dropout == 0.0
    with pytest.raises(ValueError, match="causal"):
        causal_stack(gpt2_config(8, 1, causal=False), layers=1)


def test_stacks_built_from_one_config_share_its_behaviour():
    """Two stacks from equal configs with the same seed are the same function."""
    x = torch.randn(2, 5, 16)
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        outs.append(TransformerStack(CONFIG, layers=2).eval()(x).hidden)
    torch.testing.assert_close(*outs)
