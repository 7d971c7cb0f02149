"""Observation encoders: shapes for every space kind, leading-dim equivalence, layouts, errors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from rltrans.agents.encoders import (
    ContainerEncoder,
    DiscreteEncoder,
    FlattenEncoder,
    ImageEncoder,
    MLPEncoder,
    MultiDiscreteEncoder,
    build_encoder,
    flatten_obs,
    image_layout,
)
from rltrans.envs.gym_vec import make_vector_env
from rltrans.spaces import UnsupportedSpaceError, obs_to_tensor

D = 16

SPACES: dict[str, tuple[spaces.Space, type]] = {
    "box_vector": (spaces.Box(-1, 1, (5,), np.float64), MLPEncoder),
    "box_matrix": (spaces.Box(-1, 1, (2, 3), np.float32), MLPEncoder),
    "box_scalar": (spaces.Box(-1, 1, (), np.float32), MLPEncoder),
    "image_chw_u8": (spaces.Box(0, 255, (4, 84, 84), np.uint8), ImageEncoder),
    "image_hwc_u8": (spaces.Box(0, 255, (40, 36, 3), np.uint8), ImageEncoder),
    "image_hw_u8": (spaces.Box(0, 255, (40, 40), np.uint8), ImageEncoder),
    "grid_hwc_u8": (spaces.Box(0, 10, (7, 7, 3), np.uint8), ImageEncoder),
    "image_float": (spaces.Box(0, 1, (3, 36, 36), np.float32), ImageEncoder),
    "discrete": (spaces.Discrete(5, start=2), DiscreteEncoder),
    "multidiscrete": (spaces.MultiDiscrete([3, 5, 2]), MultiDiscreteEncoder),
    "multidiscrete_2d": (
        spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, 0], [0, -1]]),
        MultiDiscreteEncoder,
    ),
    "multibinary": (spaces.MultiBinary(4), MLPEncoder),
    "dict": (
        spaces.Dict(
            {
                "pos": spaces.Box(-1, 1, (3,), np.float32),
                "k": spaces.Discrete(3),
                "inner": spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(2))),
            }
        ),
        ContainerEncoder,
    ),
    "tuple": (
        spaces.Tuple((spaces.Discrete(4), spaces.Box(0, 255, (3, 40, 40), np.uint8))),
        ContainerEncoder,
    ),
}


def _batch(space: spaces.Space, n: int, seed: int = 0) -> Any:
    """n samples of ``space`` stacked the way a vector env returns them."""
    batched = batch_space(space, n)
    batched.seed(seed)
    return obs_to_tensor(batched.sample(), space)


def _reshape_lead(x: Any, shape: tuple[int, ...]) -> Any:
    """Reshape the first dim of every leaf of a tensor tree into ``shape``."""
    if isinstance(x, dict):
        return {k: _reshape_lead(v, shape) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_reshape_lead(v, shape) for v in x)
    return x.reshape(*shape, *x.shape[1:])


@pytest.mark.parametrize("name", list(SPACES))
def test_every_space_kind_maps_leading_dims_to_out_dim(name: str) -> None:
    space, expected_cls = SPACES[name]
    enc = build_encoder(space, D)
    assert isinstance(enc, expected_cls)
    x = _batch(space, 6)
    flat = enc(x)
    assert flat.shape == (6, D) and flat.dtype == torch.float32
    # (B, L, ...) gives exactly the (B*L, ...) result, reshaped.
    seq = enc(_reshape_lead(x, (2, 3)))
    assert seq.shape == (2, 3, D)
    torch.testing.assert_close(seq.reshape(6, D), flat)
    # Samples are encoded independently: the output of sample 0 does not depend on the others.
    torch.testing.assert_close(enc(_reshape_lead(x, (6,)))[:1], enc(_reshape_lead_slice(x)))
    # Every parameter takes part (no dead branch).
    flat.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def _reshape_lead_slice(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _reshape_lead_slice(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_reshape_lead_slice(v) for v in x)
    return x[:1]


@pytest.mark.parametrize(
    ("shape", "dtype", "channels", "expected"),
    [
        ((4, 84, 84), np.uint8, "auto", "chw"),
        ((84, 84, 4), np.uint8, "auto", "hwc"),
        ((210, 160, 3), np.uint8, "auto", "hwc"),
        ((7, 7, 3), np.uint8, "auto", "hwc"),
        ((3, 64, 64), np.float32, "auto", "chw"),
        ((3, 8, 8), np.float32, "auto", None),  # small float 3-D: not an image
        ((64, 64), np.uint8, "auto", "hw"),
        ((5, 6), np.float32, "auto", None),
        ((36, 36, 36), np.uint8, "auto", "hwc"),  # tie goes to channel-last
        ((36, 36, 36), np.uint8, "first", "chw"),
        ((64,), np.uint8, "auto", None),
    ],
)
def test_image_layout_detection(shape: tuple, dtype: type, channels: str, expected: str) -> None:
    assert image_layout(spaces.Box(0, 255, shape, dtype), channels) == expected


def test_channel_last_equals_channel_first_with_same_weights() -> None:
    first = build_encoder(spaces.Box(0, 255, (4, 48, 40), np.uint8), D)
    last = build_encoder(spaces.Box(0, 255, (48, 40, 4), np.uint8), D)
    last.load_state_dict(first.state_dict())
    x = torch.randint(0, 256, (2, 3, 4, 48, 40), dtype=torch.uint8)  # (B, L, C, H, W)
    torch.testing.assert_close(last(x.permute(0, 1, 3, 4, 2)), first(x))


def test_uint8_images_are_scaled_by_1_over_255() -> None:
    as_u8 = build_encoder(spaces.Box(0, 255, (4, 84, 84), np.uint8), D)
    as_float = build_encoder(spaces.Box(0, 1, (4, 84, 84), np.float32), D)
    as_float.load_state_dict(as_u8.state_dict())
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(as_u8(x), as_float(x.float() / 255))
    assert as_u8(x).abs().max() < 100  # unscaled 0..255 inputs would blow the activations up


@pytest.mark.parametrize(
    ("space_dtype", "frames"), [(np.uint8, "uint8"), (np.uint8, "float"), (np.float32, "float")]
)
def test_image_encoder_in_place_work_leaves_inputs_and_gradients_alone(
    space_dtype: type, frames: str
) -> None:
    """The in-place scaling and ReLUs: the caller's frames are unchanged (a float frame is
    never scaled in place, even by a uint8 space's 1/255) and outputs and gradients equal
    out-of-place reference math."""
    torch.manual_seed(0)
    enc = build_encoder(spaces.Box(0, 255, (40, 36, 3), space_dtype), D)
    x = torch.randint(0, 256, (5, 40, 36, 3), dtype=torch.uint8)
    x = x if frames == "uint8" else x.float()
    before = x.clone()
    out = enc(x)
    assert torch.equal(x, before)
    convs = [m for m in enc.conv if isinstance(m, torch.nn.Conv2d)]
    h = x.permute(0, 3, 1, 2).float() * enc.scale  # (B, C, H, W)
    for conv in convs:
        h = torch.nn.functional.relu(conv(h))
    lin1, lin2 = enc.head[1], enc.head[3]
    want = lin2(torch.nn.functional.relu(lin1(h.flatten(1))))
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    grads = torch.autograd.grad(out.square().sum(), list(enc.parameters()))
    refs = torch.autograd.grad(want.square().sum(), list(enc.parameters()))
    for g, r in zip(grads, refs, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_nature_cnn_architecture() -> None:
    enc = build_encoder(spaces.Box(0, 255, (4, 84, 84), np.uint8), D)
    convs = [m for m in enc.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    assert enc.head[1].in_features == 64 * 7 * 7 and enc.head[1].out_features == 512


@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_discrete_encoders_equal_the_mlp_on_one_hots(act) -> None:
    """The lookup paths compute exactly MLPEncoder's Linear -> act -> Linear on the one-hot
    (Discrete) or the concatenated one-hots (MultiDiscrete), start values subtracted."""
    disc = build_encoder(spaces.Discrete(5, start=-2), D, activation=act)
    x = torch.tensor([[-2, 0], [2, 1]])  # (B, L)
    one_hot = torch.nn.functional.one_hot(x + 2, 5).float()  # (B, L, 5)
    torch.testing.assert_close(disc(x), disc.net(one_hot))

    md_space = spaces.MultiDiscrete([3, 5, 2], start=[1, 0, 4])
    md = build_encoder(md_space, D, activation=act)
    a = torch.tensor([[1, 4, 5], [3, 0, 4]])
    hots = [torch.nn.functional.one_hot(a[:, i] - s, n) for i, (s, n) in enumerate(
        zip([1, 0, 4], [3, 5, 2], strict=True))]  # fmt: skip
    torch.testing.assert_close(md(a), md.net(torch.cat(hots, dim=-1).float()))


def test_a_discrete_encoder_starts_as_the_one_hot_mlp_does() -> None:
    """Same initialisation as MLPEncoder on a Box of n values: orthogonal with gain sqrt(2),
    zero bias (a bare nn.Embedding drew N(0, 1) rows and had no nonlinearity)."""
    torch.manual_seed(0)
    disc = build_encoder(spaces.Discrete(16), 64, hidden_dim=32)
    torch.manual_seed(0)
    box = build_encoder(spaces.Box(0, 1, (16,), np.float32), 64, hidden_dim=32)
    assert isinstance(box, MLPEncoder)
    for mine, theirs in zip(disc.state_dict().values(), box.state_dict().values(), strict=True):
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("name", ["dict", "tuple", "multidiscrete_2d"])
def test_flatten_obs_matches_gymnasium_flatten(name: str) -> None:
    space = SPACES[name][0]
    batched = batch_space(space, 4)
    batched.seed(1)
    sample = batched.sample()
    ours = flatten_obs(obs_to_tensor(sample, space), space)
    theirs = np.stack([spaces.flatten(space, x) for x in gym.vector.utils.iterate(batched, sample)])
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-6)


def test_dict_per_key_vs_flatten() -> None:
    space = SPACES["dict"][0]
    per_key = build_encoder(space, D)
    flat = build_encoder(space, D, dict_mode="flatten")
    assert isinstance(per_key, ContainerEncoder) and isinstance(flat, FlattenEncoder)
    assert set(per_key.encoders) == {"inner", "k", "pos"}
    assert isinstance(per_key.encoders["inner"], ContainerEncoder)  # nested Tuple, per entry
    assert flat.mlp.net[0].in_features == spaces.flatdim(space) == 3 + 3 + 2 + 2
    x = _batch(space, 5)
    assert per_key(x).shape == flat(x).shape == (5, D)
    # Each key reaches the output of both encoders.
    changed = dict(x, pos=x["pos"] + 0.5)
    assert not torch.allclose(per_key(x), per_key(changed))
    assert not torch.allclose(flat(x), flat(changed))


MINIGRID_LIKE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
        "direction": spaces.Discrete(4),
        "mission": spaces.Text(max_length=32),
    }
)


@pytest.mark.parametrize("dict_mode", ["per_key", "flatten"])
def test_text_subspace_error_names_key_and_filter_wrapper(dict_mode: str) -> None:
    with pytest.raises(UnsupportedSpaceError) as err:
        build_encoder(MINIGRID_LIKE, D, dict_mode=dict_mode)
    msg = str(err.value)
    assert 'obs["mission"]' in msg and "Text" in msg
    assert "gymnasium.wrappers.FilterObservation" in msg and "wrappers:" in msg
    assert "filter_keys: ['direction', 'image']" in msg


def test_nested_and_top_level_unsupported_spaces() -> None:
    nested = spaces.Dict(
        {"a": spaces.Tuple((spaces.Discrete(2), spaces.Graph(spaces.Box(0, 1, (2,)), None)))}
    )
    with pytest.raises(
        UnsupportedSpaceError, match=r'obs\["a"\]\[1\] has space Graph.*TransformObservation'
    ):
        build_encoder(nested, D)
    with pytest.raises(UnsupportedSpaceError, match=r"obs has space Sequence"):
        build_encoder(spaces.Sequence(spaces.Discrete(3)), D)
    with pytest.raises(UnsupportedSpaceError, match=r'obs\["m"\] has space Text'):
        obs_to_tensor({"m": ["hi"]}, spaces.Dict({"m": spaces.Text(4)}))


class MissionEnv(gym.Env):
    observation_space = MINIGRID_LIKE
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


def test_suggested_wrapper_makes_the_env_encodable() -> None:
    gym.register("RltransMissionProbe-v0", entry_point=MissionEnv)
    keep = {
        "path": "gymnasium.wrappers.FilterObservation",
        "kwargs": {"filter_keys": ["direction", "image"]},
    }
    envs = make_vector_env("RltransMissionProbe-v0", 2, wrappers=[keep])
    enc = build_encoder(envs.single_observation_space, D)
    obs, _ = envs.reset(seed=0)
    assert enc(obs_to_tensor(obs, envs.single_observation_space)).shape == (2, D)


def test_obs_to_tensor_dtypes_and_structure() -> None:
    space = spaces.Dict(
        {"img": spaces.Box(0, 255, (3, 4, 4), np.uint8), "x": spaces.Box(-1, 1, (2,), np.float64)}
    )
    obs = {"img": np.zeros((5, 3, 4, 4), np.uint8), "x": np.ones((5, 2), np.float64)}
    t = obs_to_tensor(obs, space)
    assert t["img"].dtype == torch.uint8 and t["x"].dtype == torch.float32
    assert t["x"].shape == (5, 2)
    again = obs_to_tensor({"img": t["img"], "x": torch.ones(5, 2, dtype=torch.float64)}, space)
    assert again["x"].dtype == torch.float32 and again["img"] is t["img"]
    tup = obs_to_tensor(
        (np.arange(3), np.zeros((3, 2))), spaces.Tuple((spaces.Discrete(3), spaces.Box(0, 1, (2,))))
    )
    assert isinstance(tup, tuple) and tup[0].dtype == torch.int64


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"dict_mode": "concat"}, r"dict_mode='concat'; valid: \['flatten', 'per_key'\]"),
        ({"activation": "gelu"}, r"activation='gelu'; valid: \['relu', 'tanh'\]"),
        ({"channels": "middle"}, r"channels='middle'; valid"),
    ],
)
def test_bad_options_list_valid_ones(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_encoder(spaces.Box(0, 255, (4, 84, 84), np.uint8), D, **kwargs)
