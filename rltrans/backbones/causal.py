"""GPT-style causal stack for the Decision Transformer: `TransformerStack` with no memory.

Decision Transformer (Chen et al. 2021, section 3) runs its interleaved (R, s, a) tokens
through GPT-2 (Radford et al. 2019). Every piece of GPT-2 is already an option of the shared
core, so this module only fixes the defaults and GPT-2's weight initialisation:

===================  ============================  ==============================================
GPT-2 part           core option                   note
===================  ============================  ==============================================
LN before each       ``norm="pre"``                identity path from input to output
sub-layer, ln_f      final LayerNorm               added by ``TransformerStack`` for ``pre``
x + sublayer(x)      ``gate="residual"``,
                     ``sublayer_activation="none"``
MLP 4D, GELU         ``ff_mult=4``,                the core's FeedForward; DT's Gym code
                     ``ff_activation="gelu"``       uses ReLU (``ff_activation="relu"``)
resid/attn dropout   ``dropout``, ``attn_dropout``  DT uses 0.1 for both
position embedding   ``position="none"``           DT removes GPT-2's wpe: every token already
                                                   carries its episode timestep embedding
causal mask          ``causal=True``, memory 0     the action of step t sees only tokens <= s_t
init N(0, 0.02)      ``init="gpt2"``               residual projections scaled by 1/sqrt(2Y)
===================  ============================  ==============================================

Dropout sits where GPT-2 has it (embeddings, attention weights, each sub-layer's output;
not the MLP's hidden layer); on CPU its masks come from :mod:`rltrans.core.dropout`. The Gym
experiments' ReLU MLP is ``ff_activation="relu"`` (GELU is GPT-2's and DT's Atari minGPT).
Attention is never re-implemented here: every option above is the core of :mod:`rltrans.core`.
``TransformerStack(outputs=...)`` lets a caller that needs only some positions (DT: the
state tokens) skip the last layer's work everywhere else.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from torch import nn

from rltrans.backbones.gtrxl import TransformerStack
from rltrans.choices import check_choice
from rltrans.core.block import BlockConfig

__all__ = ["INITS", "Init", "causal_stack", "gpt2_config", "gpt2_init_"]

Init = Literal["gpt2", "torch"]
INITS: tuple[str, ...] = get_args(Init)
GPT2_INIT_STD = 0.02  # GPT-2's initializer_range
# GPT-2's block as DT uses it (the module table); dropout 0.1 on attention and residuals.
GPT2_OPTIONS: dict[str, Any] = {
    "position": "none",
    "gate": "residual",
    "norm": "pre",
    "sublayer_activation": "none",
    "ff_activation": "gelu",
    "dropout": 0.1,
    "attn_dropout": 0.1,
}


def gpt2_config(dim: int, heads: int, **overrides: Any) -> BlockConfig:
    """The BlockConfig of GPT-2's block as DT uses it; overrides change one part of it.

    DT sets GPT-2's attn_pdrop and resid_pdrop to the same value, so an overridden
    ``dropout`` also sets ``attn_dropout`` unless that is given too.
    """
    if "dropout" in overrides and "attn_dropout" not in overrides:
        overrides["attn_dropout"] = overrides["dropout"]
    return BlockConfig(dim=dim, heads=heads, **{**GPT2_OPTIONS, **overrides})


def gpt2_init_(stack: TransformerStack) -> TransformerStack:
    """GPT-2 initialisation in place: projections N(0, 0.02), biases 0, LayerNorms (1, 0).

    The projections that write into the residual stream (attention output, second MLP layer)
    get std 0.02 / sqrt(2 Y), Y layers (Radford et al. 2019, section 2.3: "scale the weights
    of residual layers at initialization by a factor of 1/sqrt(N)", N residual layers). Only
    the attention and MLP projections are touched: gates and position schemes keep their own
    initialisation (a ``gru`` gate's bias, ``xl``'s W_kR).
    """
    residual_std = GPT2_INIT_STD / math.sqrt(2 * max(stack.layers, 1))
    for block in stack.blocks:
        attn = block.attn
        mlp_linears = [m for m in block.mlp.modules() if isinstance(m, nn.Linear)]
        projections = [attn.qkv_proj, *mlp_linears[:-1]]
        residual = [attn.out_proj, mlp_linears[-1]]
        for layer, std in [(p, GPT2_INIT_STD) for p in projections] + [
            (p, residual_std) for p in residual
        ]:
            nn.init.normal_(layer.weight, mean=0.0, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    for module in stack.modules():
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    return stack


def causal_stack(config: BlockConfig, layers: int, *, init: Init = "gpt2") -> TransformerStack:
    """A causal `TransformerStack` without memory, GPT-2 initialised unless ``init="torch"``.

    ``config`` is usually :func:`gpt2_config` (GPT-2 as DT uses it); its ``max_len`` bounds
    absolute positions (``learned``) in tokens: a DT context of K steps is 3K tokens.
    ``init="gpt2"`` applies :func:`gpt2_init_`, ``"torch"`` keeps PyTorch's defaults.

    Example:
        >>> import torch
        >>> stack = causal_stack(gpt2_config(dim=64, heads=1), layers=2)
        >>> key_padding = torch.ones(4, 30, dtype=torch.bool)
        >>> stack(torch.randn(4, 30, 64), key_padding=key_padding).hidden.shape
        torch.Size([4, 30, 64])
    """
    check_choice("init", init, INITS)
    if not config.causal:
        raise ValueError("causal_stack needs BlockConfig.causal=True")
    stack = TransformerStack(config, layers, memory=0)
    return gpt2_init_(stack) if init == "gpt2" else stack
