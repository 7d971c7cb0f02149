"""Observation encoders: one ``nn.Module`` per Gymnasium space kind, (..., *obs) -> (..., D).

``build_encoder(space, out_dim)`` picks the encoder from the space once, at build time:

============================  ===============================================================
space                         encoder
============================  ===============================================================
Box, image (see below)        :class:`ImageEncoder`: Nature-CNN (Mnih et al. 2015), or a 3x3
                              CNN when the image is smaller than Nature-CNN's 36x36 minimum
Box, other                    :class:`MLPEncoder`: flatten -> Linear -> act -> Linear
MultiBinary                   :class:`MLPEncoder` on the 0/1 vector as floats
Discrete                      :class:`DiscreteEncoder`: the one-hot's MLP, run as a lookup
MultiDiscrete                 :class:`MultiDiscreteEncoder`: the one-hots' MLP, as K lookups
Dict / Tuple, ``per_key``     :class:`ContainerEncoder`: one encoder per entry, concat, act, Linear
Dict / Tuple, ``flatten``     :class:`FlattenEncoder`: ``gymnasium.spaces.flatten`` layout -> MLP
============================  ===============================================================

Inputs are what :func:`rltrans.spaces.obs_to_tensor` returns: raw space values (uint8 images stay
uint8 and are scaled by 1/255 here; Discrete as integers). Any number of leading dims is allowed -
(B, ...), (B, L, ...), (T, N, ...) - the output is (*leading, D). Every encoder ends in a Linear
(no activation): the backbone that follows applies its own norm and nonlinearity.

Image detection for a Box: 3-D with dtype uint8 or both spatial sides >= 32, or 2-D uint8 /
both sides >= 32 (one channel). Channel-first vs -last: the channel axis is the smaller of the
first and last axes, ties going to channel-last (Gymnasium's render layout); ``channels=``
overrides it.
So (4, 84, 84) frame stacks are channel-first and (210, 160, 3) or (7, 7, 3) channel-last.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rltrans.spaces import TensorTree, check_encodable

Activation = Literal["relu", "tanh"]
DictMode = Literal["flatten", "per_key"]
Channels = Literal["auto", "first", "last"]
ImageLayout = Literal["chw", "hwc", "hw"]

ACTIVATION_LAYERS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
# Smallest side Nature-CNN accepts: (8x8 stride 4) -> (4x4 stride 2) -> (3x3 stride 1) >= 1 px.
NATURE_CNN_MIN_SIDE = 36
IMAGE_MIN_SIDE = 32


def layer_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with ``gain`` and constant bias (Engstrom et al. 2020; CleanRL)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def activation_layer(name: Activation) -> nn.Module:
    """The activation module of ``name`` (``relu`` or ``tanh``)."""
    if name not in ACTIVATION_LAYERS:
        raise ValueError(f"activation={name!r}; valid: {list(ACTIVATION_LAYERS)}")
    return ACTIVATION_LAYERS[name]()


def mlp(in_dim: int, hidden_dim: int, out_dim: int, act: Activation) -> nn.Sequential:
    """Linear -> act -> Linear, orthogonally initialised (the last with gain 1)."""
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, hidden_dim)),
        activation_layer(act),
        layer_init(nn.Linear(hidden_dim, out_dim), gain=1.0),
    )


def image_layout(space: spaces.Space, channels: Channels = "auto") -> ImageLayout | None:
    """Returns how a Box holds an image ("chw", "hwc", "hw"), or None when it is not an image."""
    if channels not in ("auto", "first", "last"):
        raise ValueError(f"channels={channels!r}; valid: ['auto', 'first', 'last']")
    if not isinstance(space, spaces.Box) or len(space.shape) not in (2, 3):
        return None
    is_uint8 = space.dtype == np.uint8
    if len(space.shape) == 2:
        return "hw" if is_uint8 or min(space.shape) >= IMAGE_MIN_SIDE else None
    first, last = space.shape[0], space.shape[-1]
    if channels == "auto":
        channels = "first" if first < last else "last"
    layout: ImageLayout = "chw" if channels == "first" else "hwc"
    spatial = space.shape[1:] if layout == "chw" else space.shape[:2]
    return layout if is_uint8 or min(spatial) >= IMAGE_MIN_SIDE else None


class MLPEncoder(nn.Module):
    """Flattens the event dims of a Box/MultiBinary observation: Linear -> act -> Linear."""

    def __init__(
        self, event_shape: tuple[int, ...], out_dim: int, hidden_dim: int, act: Activation
    ):
        super().__init__()
        self.event_ndim = len(event_shape)
        in_dim = int(np.prod(event_shape, dtype=np.int64))  # () -> 1 for a scalar Box
        self.net = mlp(in_dim, hidden_dim, out_dim, act)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., *event) -> (..., out_dim)."""
        lead = x.shape[: x.ndim - self.event_ndim]
        return self.net(x.reshape(*lead, -1).float())  # (..., prod(event))


# The conv stacks' ReLUs work in place: a convolution's backward reads its input, never its
# output, so the output can hold the ReLU's (which its backward reads) and the stack keeps one
# activation per layer instead of two (MiniGrid's 512-frame minibatch: 42 MB fewer live tensors).


# Conv stacks as (out_channels, kernel, stride, padding) per layer, ReLU after each (the
# reconstruction decoder runs them backwards). Nature-CNN: Mnih et al. 2015, Methods "Model
# architecture": 32 8x8/4, 64 4x4/2, 64 3x3/1. Small: for grids below Nature-CNN's minimum
# (e.g. MiniGrid's 7x7x3), 3x3 convs, one stride 2 to halve the side before the flatten; our
# choice, no published standard for such inputs.
ConvLayer = tuple[int, int, int, int]
NATURE_CONV: tuple[ConvLayer, ...] = ((32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0))
SMALL_CONV: tuple[ConvLayer, ...] = ((32, 3, 1, 1), (64, 3, 2, 1), (64, 3, 1, 1))


def conv_stack(in_channels: int, layers: tuple[ConvLayer, ...]) -> nn.Sequential:
    """Conv2d -> ReLU (in place) per layer of ``layers``, orthogonally initialised."""
    modules: list[nn.Module] = []
    for out, kernel, stride, padding in layers:
        conv = nn.Conv2d(in_channels, out, kernel, stride=stride, padding=padding)
        modules += [layer_init(conv), nn.ReLU(inplace=True)]
        in_channels = out
    return nn.Sequential(*modules)


def _nature_conv(in_channels: int) -> nn.Sequential:
    return conv_stack(in_channels, NATURE_CONV)


def _small_conv(in_channels: int) -> nn.Sequential:
    return conv_stack(in_channels, SMALL_CONV)


class ImageEncoder(nn.Module):
    """Conv stack -> flatten -> Linear(512) -> ReLU -> Linear(out_dim); uint8 scaled by 1/255."""

    def __init__(self, space: spaces.Box, layout: ImageLayout, out_dim: int):
        super().__init__()
        shape = space.shape
        # One sample as 3-D (hw gets a channel axis) and the permutation of a (B, *that) batch
        # to (B, C, H, W), both fixed at build time.
        self._event_shape = (1, *shape) if layout == "hw" else shape
        self._to_chw = (0, 3, 1, 2) if layout == "hwc" else (0, 1, 2, 3)
        c, h, w = (shape[2], *shape[:2]) if layout == "hwc" else self._event_shape
        self.event_ndim = len(shape)
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        self.conv = _nature_conv(c) if min(h, w) >= NATURE_CNN_MIN_SIDE else _small_conv(c)
        with torch.no_grad():
            n_flat = self.conv(torch.zeros(1, c, h, w)).numel()
        self.head = nn.Sequential(
            nn.Flatten(),
            layer_init(nn.Linear(n_flat, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, out_dim), gain=1.0),
        )
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., *image) -> (..., out_dim)."""
        lead = x.shape[: x.ndim - self.event_ndim]
        x = x.reshape(-1, *self._event_shape).permute(self._to_chw)  # (B*, C, H, W)
        # Integer frames -> our own float copy, scaled in place (one float copy of the frames,
        # not two); a float input is the caller's tensor and is never scaled in place.
        x = x.float() * self.scale if x.is_floating_point() else x.float().mul_(self.scale)
        y = self.head(self.conv(x))  # (B*, out_dim)
        return y.reshape(*lead, self.out_dim)


class DiscreteEncoder(nn.Module):
    """A Discrete observation as :class:`MLPEncoder` sees its one-hot: Linear -> act ->
    Linear, with the same initialisation. The first Linear on a one-hot picks one column of
    its weight, so it runs as that lookup (O(hidden) per step, not an n x hidden matmul).
    A bare ``nn.Embedding`` (N(0, 1) rows, no nonlinearity) left PPO memory agents at chance
    where the one-hot MLP learned."""

    def __init__(self, space: spaces.Discrete, out_dim: int, hidden_dim: int, act: Activation):
        super().__init__()
        self.start = int(space.start)
        self.net = mlp(int(space.n), hidden_dim, out_dim, act)  # as on the one-hot
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(...) integer -> (..., out_dim)."""
        first = self.net[0]
        hidden = first.weight.t()[x.long() - self.start] + first.bias  # (..., hidden)
        return self.net[2](self.net[1](hidden))


class MultiDiscreteEncoder(nn.Module):
    """A MultiDiscrete observation as :class:`MLPEncoder` sees its concatenated one-hots:
    Linear -> act -> Linear. The first Linear on K one-hots is the sum of K columns of its
    weight (one per dim, at the dim's offset), so it runs as K lookups."""

    def __init__(self, space: spaces.MultiDiscrete, out_dim: int, hidden_dim: int, act: Activation):
        super().__init__()
        nvec = space.nvec.reshape(-1).astype(np.int64)
        self.event_ndim = space.nvec.ndim
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        self.register_buffer("offsets", torch.as_tensor(offsets), persistent=False)
        self.register_buffer(
            "start", torch.as_tensor(space.start.reshape(-1).astype(np.int64)), persistent=False
        )
        self.net = mlp(int(nvec.sum()), hidden_dim, out_dim, act)  # as on the one-hots
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., *nvec.shape) integer -> (..., out_dim)."""
        lead = x.shape[: x.ndim - self.event_ndim]
        idx = x.reshape(*lead, -1).long() - self.start + self.offsets  # (..., K)
        first = self.net[0]
        hidden = first.weight.t()[idx].sum(dim=-2) + first.bias  # (..., hidden)
        return self.net[2](self.net[1](hidden))


def flatten_obs(x: TensorTree, space: spaces.Space) -> torch.Tensor:
    """Batched ``gymnasium.spaces.flatten``: (..., *obs) -> (..., flatdim) float32, same layout.

    Box and MultiBinary flatten as values, Discrete and MultiDiscrete as one-hots (after
    subtracting ``start``), Dict/Tuple entries concatenated in the space's order.
    """
    if isinstance(space, spaces.Dict):
        return torch.cat([flatten_obs(x[k], sub) for k, sub in space.spaces.items()], dim=-1)
    if isinstance(space, spaces.Tuple):
        return torch.cat(
            [flatten_obs(xi, sub) for xi, sub in zip(x, space.spaces, strict=True)], -1
        )
    if isinstance(space, spaces.Discrete):
        return nn.functional.one_hot(x.long() - int(space.start), int(space.n)).float()
    if isinstance(space, spaces.MultiDiscrete):
        lead = x.shape[: x.ndim - space.nvec.ndim]
        start = torch.as_tensor(space.start.reshape(-1), device=x.device)
        idx = x.reshape(*lead, -1).long() - start  # (..., K)
        hots = [nn.functional.one_hot(idx[..., k], int(n)) for k, n in enumerate(space.nvec.flat)]
        return torch.cat(hots, dim=-1).float()
    shape = space.shape  # Box, MultiBinary
    lead = x.shape[: x.ndim - len(shape)]
    return x.reshape(*lead, -1).float()


class FlattenEncoder(nn.Module):
    """:func:`flatten_obs` of a whole Dict/Tuple, then one MLP."""

    def __init__(self, space: spaces.Space, out_dim: int, hidden_dim: int, act: Activation):
        super().__init__()
        self.space = space
        self.mlp = MLPEncoder((spaces.flatdim(space),), out_dim, hidden_dim, act)
        self.out_dim = out_dim

    def forward(self, x: TensorTree) -> torch.Tensor:
        """Tree of (..., *obs) -> (..., out_dim)."""
        return self.mlp(flatten_obs(x, self.space))


class ContainerEncoder(nn.Module):
    """One encoder per Dict key / Tuple index; outputs concatenated -> act -> Linear(out_dim)."""

    def __init__(
        self,
        space: spaces.Dict | spaces.Tuple,
        encoders: dict[str, nn.Module],
        out_dim: int,
        act: Activation,
    ):
        super().__init__()
        # Tuple entries are stored under "0", "1", ... (ModuleDict keys must be strings).
        self.entry_keys: list[str | int] = (
            list(space.spaces) if isinstance(space, spaces.Dict) else list(range(len(space.spaces)))
        )
        self.encoders = nn.ModuleDict(encoders)
        width = sum(e.out_dim for e in encoders.values())
        self.proj = nn.Sequential(
            activation_layer(act), layer_init(nn.Linear(width, out_dim), gain=1.0)
        )
        self.out_dim = out_dim

    def forward(self, x: TensorTree) -> torch.Tensor:
        """Dict/tuple of (..., *obs_k) -> (..., out_dim)."""
        parts = [enc(x[k]) for k, enc in zip(self.entry_keys, self.encoders.values(), strict=True)]
        return self.proj(torch.cat(parts, dim=-1))  # (..., sum_k D) -> (..., out_dim)


def build_encoder(
    space: spaces.Space,
    out_dim: int,
    *,
    dict_mode: DictMode = "per_key",
    hidden_dim: int = 256,
    activation: Activation = "relu",
    channels: Channels = "auto",
) -> nn.Module:
    """Builds the encoder for one observation of ``space`` (the single-env space) -> ``out_dim``.

    ``dict_mode``: ``per_key`` encodes each Dict/Tuple entry with its own encoder; ``flatten``
    flattens the whole observation (gymnasium.spaces.flatten layout) into one MLP.
    ``hidden_dim`` and ``activation`` set the MLPs' hidden layer; ``channels`` overrides the image
    channel-axis detection. The module has ``out_dim``.

    Example::

        enc = build_encoder(envs.single_observation_space, 128)
        h = enc(obs_to_tensor(obs, envs.single_observation_space))  # (N, 128)
    """
    if dict_mode not in ("flatten", "per_key"):
        raise ValueError(f"dict_mode={dict_mode!r}; valid: ['flatten', 'per_key']")
    activation_layer(activation)  # validate early, whatever the space
    if channels not in ("auto", "first", "last"):
        raise ValueError(f"channels={channels!r}; valid: ['auto', 'first', 'last']")
    check_encodable(space)
    if isinstance(space, spaces.Dict | spaces.Tuple):
        if dict_mode == "flatten":
            return FlattenEncoder(space, out_dim, hidden_dim, activation)
        items = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        subs = {
            str(k): build_encoder(
                sub,
                out_dim,
                dict_mode=dict_mode,
                hidden_dim=hidden_dim,
                activation=activation,
                channels=channels,
            )
            for k, sub in items
        }
        return ContainerEncoder(space, subs, out_dim, activation)
    if isinstance(space, spaces.Discrete):
        return DiscreteEncoder(space, out_dim, hidden_dim, activation)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiDiscreteEncoder(space, out_dim, hidden_dim, activation)
    if isinstance(space, spaces.MultiBinary):
        return MLPEncoder(tuple(space.shape), out_dim, hidden_dim, activation)
    layout = image_layout(space, channels)
    if layout is not None:
        return ImageEncoder(space, layout, out_dim)
    return MLPEncoder(tuple(space.shape), out_dim, hidden_dim, activation)


class FlattenSteps(nn.Module):
    """Windows of vector steps for the Decision Transformer and its BC baseline:
    (B, K, *obs) -> (B, K, prod(obs)) float, then an optional Linear to D."""

    def __init__(self, obs_shape: tuple[int, ...], dim: int | None = None) -> None:
        super().__init__()
        flat = math.prod(obs_shape)
        self.linear = nn.Identity() if dim is None else nn.Linear(flat, dim)
        self.out_dim = flat if dim is None else dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Flatten the dims after (B, K), then project."""
        return self.linear(x.reshape(*x.shape[:2], -1).float())
