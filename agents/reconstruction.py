"""Observation decoders for the reconstruction auxiliary loss: backbone output h (..., D) -> the
observation of the same step.

Memory Gym (Pleines et al. 2024) trains TrXL with an extra loss that decodes each step's
observation back from the transformer's output, which shapes what the memory keeps (their
agent solves Mortar Mayhem with it). ``build_decoder(space, dim)`` picks one decoder per space
kind, once, at build time, mirroring :func:`rltrans.agents.encoders.build_encoder`:

============================  ===============================================================
space                         decoder and per-step loss
============================  ===============================================================
Box, image                    :class:`ImageDecoder`: Linear -> transposed convolutions that
                              mirror the encoder's conv stack, back to the image size; MSE
                              against the image scaled as the encoder scales it (uint8 / 255)
Box, other                    :class:`VectorDecoder`: Linear -> act -> Linear; MSE
Discrete                      :class:`DiscreteDecoder`: logits; cross-entropy
MultiDiscrete                 :class:`MultiDiscreteDecoder`: logits per dim; mean cross-entropy
MultiBinary                   :class:`MultiBinaryDecoder`: logits per bit; mean binary CE
Dict / Tuple                  :class:`ContainerDecoder`: one decoder per entry; losses summed
============================  ===============================================================

Every decoder's ``forward(h)`` returns its prediction (values in the observation's own layout,
or logits) and ``loss(h, obs)`` the loss of each step (...,): the mean over the observation's
elements, summed over Dict/Tuple entries. Targets are the observations as the encoder gets them
(normalised where ``normalize_obs`` is on) and are never differentiated.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.nn import functional as F

from rltrans.agents.encoders import (
    ACTIVATION_LAYERS,
    NATURE_CNN_MIN_SIDE,
    NATURE_CONV,
    SMALL_CONV,
    Activation,
    Channels,
    ConvLayer,
    ImageLayout,
    image_layout,
    layer_init,
    mlp,
)
from rltrans.losses.ppo import masked_mean
from rltrans.spaces import TensorTree, check_encodable
from rltrans.types import Aux


class VectorDecoder(nn.Module):
    """A Box observation of any non-image shape: MLP -> (..., *shape); MSE per step."""

    def __init__(
        self, event_shape: tuple[int, ...], dim: int, hidden_dim: int, act: Activation
    ) -> None:
        super().__init__()
        self.event_shape = tuple(event_shape)
        self.net = mlp(dim, hidden_dim, math.prod(self.event_shape), act)  # () -> 1

    def forward(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., *shape)."""
        return self.net(h).reshape(*h.shape[:-1], *self.event_shape)

    def loss(self, h: Tensor, obs: Tensor) -> Tensor:
        """Mean squared error over the observation's elements, per step (...,)."""
        error = (self(h).float() - obs.detach().float()) ** 2
        return error.reshape(*h.shape[:-1], -1).mean(-1)


def conv_sizes(side: int, layers: tuple[ConvLayer, ...]) -> list[int]:
    """The side of the input and of each conv layer's output: [side, s_1, ..., s_n]."""
    sizes = [side]
    for _, kernel, stride, padding in layers:
        sizes.append((sizes[-1] + 2 * padding - kernel) // stride + 1)
    return sizes


class ImageDecoder(nn.Module):
    """Linear -> ReLU -> the encoder's conv stack transposed, back to (..., *image); MSE per
    step against the image scaled as :class:`~rltrans.agents.encoders.ImageEncoder` scales it
    (uint8 by 1/255, so targets lie in [0, 1]). The output is linear (no sigmoid)."""

    def __init__(self, space: spaces.Box, layout: ImageLayout, dim: int) -> None:
        super().__init__()
        shape = tuple(space.shape)
        self.event_shape = shape
        chw = (1, *shape) if layout == "hw" else shape  # hw: one channel
        c, h, w = (shape[2], *shape[:2]) if layout == "hwc" else chw
        # (B, C, H, W) -> the space's layout, fixed at build time.
        self._from_chw = (0, 2, 3, 1) if layout == "hwc" else (0, 1, 2, 3)
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        layers = NATURE_CONV if min(h, w) >= NATURE_CNN_MIN_SIDE else SMALL_CONV
        hs, ws = conv_sizes(h, layers), conv_sizes(w, layers)
        self.start = (layers[-1][0], hs[-1], ws[-1])  # the encoder's last feature map
        self.project = nn.Sequential(layer_init(nn.Linear(dim, math.prod(self.start))), nn.ReLU())
        # Layer i maps channels out_i -> in_i and sides s_{i+1} -> s_i; output_padding (< stride)
        # restores the rows and columns the strided convolution dropped, so sizes come out exact.
        ins = [c, *(out for out, *_ in layers[:-1])]
        deconvs: list[nn.Module] = []
        for i in reversed(range(len(layers))):
            out, kernel, stride, padding = layers[i]
            extra = tuple(s[i] - ((s[i + 1] - 1) * stride - 2 * padding + kernel) for s in (hs, ws))
            last = i == 0
            deconv = nn.ConvTranspose2d(
                out, ins[i], kernel, stride=stride, padding=padding, output_padding=extra
            )
            deconvs.append(layer_init(deconv, gain=1.0 if last else math.sqrt(2)))
            if not last:
                deconvs.append(nn.ReLU(inplace=True))
        self.deconv = nn.Sequential(*deconvs)

    def forward(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., *image) in the space's layout, on the [0, 1] scale of uint8."""
        lead = h.shape[:-1]
        x = self.project(h.reshape(-1, h.shape[-1])).reshape(-1, *self.start)
        image = self.deconv(x).permute(self._from_chw)  # (B*, C, H, W) -> the space's layout
        return image.reshape(*lead, *self.event_shape)

    def loss(self, h: Tensor, obs: Tensor) -> Tensor:
        """Mean squared error over the pixels, per step (...,)."""
        target = obs.detach().float() * self.scale
        error = (self(h).float() - target) ** 2
        return error.reshape(*h.shape[:-1], -1).mean(-1)


class DiscreteDecoder(nn.Module):
    """A Discrete observation: MLP -> (..., n) logits; cross-entropy per step."""

    def __init__(self, space: spaces.Discrete, dim: int, hidden_dim: int, act: Activation) -> None:
        super().__init__()
        self.start, self.n = int(space.start), int(space.n)
        self.net = mlp(dim, hidden_dim, self.n, act)

    def forward(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., n) logits."""
        return self.net(h)

    def loss(self, h: Tensor, obs: Tensor) -> Tensor:
        """Cross-entropy of the observed value, per step (...,)."""
        logits = self(h).float().reshape(-1, self.n)
        target = (obs.detach().long() - self.start).reshape(-1)
        return F.cross_entropy(logits, target, reduction="none").reshape(h.shape[:-1])


class MultiDiscreteDecoder(nn.Module):
    """A MultiDiscrete observation: MLP -> (..., sum(nvec)) logits, one group per dim;
    cross-entropy per dim, averaged over the dims, per step."""

    def __init__(
        self, space: spaces.MultiDiscrete, dim: int, hidden_dim: int, act: Activation
    ) -> None:
        super().__init__()
        self.nvec = [int(n) for n in space.nvec.reshape(-1)]
        self.event_ndim = space.nvec.ndim
        start = torch.as_tensor(space.start.reshape(-1).astype(np.int64))
        self.register_buffer("start", start, persistent=False)
        self.net = mlp(dim, hidden_dim, sum(self.nvec), act)

    def forward(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., sum(nvec)) logits (dim k's are the k-th group of nvec[k])."""
        return self.net(h)

    def loss(self, h: Tensor, obs: Tensor) -> Tensor:
        """Mean over the dims of each dim's cross-entropy, per step (...,)."""
        lead = h.shape[:-1]
        target = obs.detach().reshape(*lead, -1).long() - self.start  # (..., K)
        groups = self(h).float().split(self.nvec, dim=-1)
        ces = [
            F.cross_entropy(g.reshape(-1, n), target[..., k].reshape(-1), reduction="none")
            for k, (g, n) in enumerate(zip(groups, self.nvec, strict=True))
        ]
        return torch.stack(ces, dim=-1).mean(-1).reshape(lead)


class MultiBinaryDecoder(nn.Module):
    """A MultiBinary observation: MLP -> (..., *shape) logits; binary cross-entropy averaged
    over the bits, per step."""

    def __init__(
        self, space: spaces.MultiBinary, dim: int, hidden_dim: int, act: Activation
    ) -> None:
        super().__init__()
        self.event_shape = tuple(space.shape)
        self.net = mlp(dim, hidden_dim, math.prod(self.event_shape), act)

    def forward(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., *shape) logits."""
        return self.net(h).reshape(*h.shape[:-1], *self.event_shape)

    def loss(self, h: Tensor, obs: Tensor) -> Tensor:
        """Mean binary cross-entropy over the bits, per step (...,)."""
        bce = F.binary_cross_entropy_with_logits(
            self(h).float(), obs.detach().float(), reduction="none"
        )
        return bce.reshape(*h.shape[:-1], -1).mean(-1)


class ContainerDecoder(nn.Module):
    """One decoder per Dict key / Tuple index; the per-step losses are summed over entries."""

    def __init__(self, space: spaces.Dict | spaces.Tuple, decoders: dict[str, nn.Module]) -> None:
        super().__init__()
        self.is_dict = isinstance(space, spaces.Dict)
        # Tuple entries are stored under "0", "1", ... (ModuleDict keys must be strings).
        self.entry_keys: list[str | int] = (
            list(space.spaces) if self.is_dict else list(range(len(space.spaces)))
        )
        self.decoders = nn.ModuleDict(decoders)

    def forward(self, h: Tensor) -> TensorTree:
        """(..., D) -> a dict / tuple of each entry's prediction."""
        outs = [dec(h) for dec in self.decoders.values()]
        if self.is_dict:
            return dict(zip(self.entry_keys, outs, strict=True))
        return tuple(outs)

    def loss(self, h: Tensor, obs: TensorTree) -> Tensor:
        """Sum over the entries of their per-step losses (...,)."""
        parts = [
            dec.loss(h, obs[k])
            for k, dec in zip(self.entry_keys, self.decoders.values(), strict=True)
        ]
        return torch.stack(parts).sum(0)


def build_decoder(
    space: spaces.Space,
    dim: int,
    *,
    hidden_dim: int = 256,
    activation: Activation = "relu",
    channels: Channels = "auto",
) -> nn.Module:
    """The decoder from a backbone output (..., ``dim``) back to one observation of ``space``.

    ``hidden_dim``, ``activation`` and ``channels`` mean what they mean to
    :func:`~rltrans.agents.encoders.build_encoder` (the agent passes its ``encoder`` options
    but ``dict_mode``, which does not apply: a Dict is always decoded per key).
    """
    if activation not in ACTIVATION_LAYERS:
        raise ValueError(f"activation={activation!r}; valid: {list(ACTIVATION_LAYERS)}")
    check_encodable(space)
    if isinstance(space, spaces.Dict | spaces.Tuple):
        items = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        subs = {
            str(k): build_decoder(
                sub, dim, hidden_dim=hidden_dim, activation=activation, channels=channels
            )
            for k, sub in items
        }
        return ContainerDecoder(space, subs)
    if isinstance(space, spaces.Discrete):
        return DiscreteDecoder(space, dim, hidden_dim, activation)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiDiscreteDecoder(space, dim, hidden_dim, activation)
    if isinstance(space, spaces.MultiBinary):
        return MultiBinaryDecoder(space, dim, hidden_dim, activation)
    layout = image_layout(space, channels)
    if layout is not None:
        return ImageDecoder(space, layout, dim)
    return VectorDecoder(tuple(space.shape), dim, hidden_dim, activation)


def reconstruction_loss(
    decoder: nn.Module, hidden: Tensor, obs: TensorTree, mask: Tensor | None = None
) -> Tensor:
    """The decoder's loss (0-d): its per-step losses averaged over the valid steps (``mask``
    (B, L), True = valid; None = every step)."""
    return masked_mean(decoder.loss(hidden, obs), mask)


def reconstruction_aux(decoder: nn.Module, hidden: Tensor, obs: TensorTree, *, coef: float) -> Aux:
    """Training aux of the reconstruction loss: ``loss_reconstruction = coef * loss`` joins the
    learner's loss; ``reconstruction``, the unweighted loss, is logged as
    ``losses/reconstruction``.

    Every token of a stored segment is a real step (rollouts hold no padding: PPO's
    minibatch mask is all True and IMPALA replays whole rollouts), so the mean over tokens is
    the mean over valid tokens, as for the ponder cost.
    """
    loss = reconstruction_loss(decoder, hidden, obs)
    return {"loss_reconstruction": coef * loss, "reconstruction": loss.detach()}


__all__ = [
    "ContainerDecoder",
    "DiscreteDecoder",
    "ImageDecoder",
    "MultiBinaryDecoder",
    "MultiDiscreteDecoder",
    "VectorDecoder",
    "build_decoder",
    "conv_sizes",
    "reconstruction_aux",
    "reconstruction_loss",
]
