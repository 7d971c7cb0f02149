"""Dropout with cheap CPU masks: uniform samples in eager code, a keyed hash in compiled graphs.

On CPU, :func:`torch.nn.functional.dropout` draws its mask with ``bernoulli_``, which costs
about three times as much as drawing uniforms with ``rand_like`` and comparing (measured in
``benchmarks/dt_throughput.py``: dropout was ~10 % of a Decision Transformer training step).
Here an element is kept when u >= p for u ~ U[0, 1), i.e. with probability 1 - p, and kept
elements are scaled by 1 / (1 - p), exactly as inverted dropout (Srivastava et al. 2014).
On other devices the fused native kernel is used unchanged.

Inside a compiled graph the mask is not drawn at all but computed: each call draws two 32-bit
seed words from torch's generator, and element i is kept when the top 24 bits of a keyed
integer hash of i are >= p * 2^24 (:func:`hash_keep`; two rounds of the ``lowbias32``
permutation as tuned by Wellons' hash prospector, keyed by the seeds). The hash is a few
integer instructions per element that Inductor vectorises, against ~4 ns per element for
aten's serial ``uniform_`` (measured: the compiled Decision Transformer step 1.05-1.07x
faster, medians of 150 interleaved steps in two runs). So compiled and eager runs draw
different masks from the same seed; each is exact inverted dropout and reproducible under
``torch.manual_seed``.

The float mask then passes through ``rltrans::saved_mask`` (a copy, opaque to Inductor).
Without it Inductor fuses the hash into the consumer, LayerNorm included, and recomputes it
and the LayerNorm in backward; with it the mask is computed once and saved (measured: the
compiled DT step was no faster than with uniforms when the hash was left to fuse). Programs
compiled by :func:`rltrans.compiling.compiled` then drop the copy again, on the joint graph,
and tag the mask as a value the partitioner must save (:mod:`rltrans.saved_masks`): the mask
is still computed once, without the copy's extra pass. A plain ``torch.compile`` keeps the
copy. Tensors of 2^31 elements or more, past the int32 counter, keep uniforms in compiled
graphs too, through ``rltrans::keep_from_uniform``: left to itself Inductor saves the
comparison as a boolean mask, whose byte stores its AVX2 code does one element at a time.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# lowbias32's multipliers as found by the hash prospector (both < 2^31, so exact in int32),
# each followed by an xor-shift: (shift, multiplier), the last without a multiplier.
HASH_ROUND = ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, 0))
UNIFORM_BITS = 24  # bits of the hash read as the uniform, as many as float32 rand draws
MAX_COUNTER = 2**31  # element counters are int32


def keep_from_uniform(u: Tensor, p: float) -> Tensor:
    """The scaled keep mask of inverted dropout from uniforms u ~ U[0, 1): 1 / (1 - p) where
    u >= p (probability 1 - p), else 0."""
    keep = torch.empty_like(u)
    return torch.ge(u, p, out=keep).mul_(1.0 / (1.0 - p))


# The same function as an opaque op, for compiled graphs (see the module docstring). Its input
# is the uniforms, not x: graph CSE would merge two identical calls of a pure op, so two
# dropouts of one tensor would share a mask; each rand_like stays its own node.
keep_mask = torch.library.custom_op(
    "rltrans::keep_from_uniform", keep_from_uniform, mutates_args=(), device_types="cpu"
)


@keep_mask.register_fake
def _keep_mask_shape(u: Tensor, p: float) -> Tensor:
    return torch.empty_like(u)


def _permute(h: Tensor) -> Tensor:
    """lowbias32 on int32 h: a bijection of 32-bit words (logical shifts via a mask)."""
    for shift, multiplier in HASH_ROUND:
        h = h ^ ((h >> shift) & ((1 << (32 - shift)) - 1))
        if multiplier:
            h = h * multiplier  # wraps modulo 2^32, as the hash needs
    return h


def keep_threshold(p: float) -> int:
    """The least 24-bit integer k with k / 2^24 >= p in float32: keep iff k >= this."""
    return math.ceil(float(np.float32(p)) * 2.0**UNIFORM_BITS)


def hash_keep(shape: torch.Size | tuple[int, ...], seeds: Tensor, p: float) -> Tensor:
    """The scaled keep mask (float32, ``shape``) of inverted dropout keyed by two int32 seeds.

    Element i (row-major) is kept when the top 24 bits of ``permute(permute(i + s0) ^ s1)``,
    read as k / 2^24, are >= p: probability 1 - p, as u >= p for u ~ U[0, 1) in float32.
    """
    n = math.prod(shape)
    if n >= MAX_COUNTER:
        raise ValueError(
            f"hash_keep counts elements in int32: {n} elements, at most {MAX_COUNTER - 1}"
        )
    h = _permute(_permute(torch.arange(n, dtype=torch.int32) + seeds[0]) ^ seeds[1])
    k = (h >> (32 - UNIFORM_BITS)) & ((1 << UNIFORM_BITS) - 1)
    return torch.where(k >= keep_threshold(p), 1.0 / (1.0 - p), 0.0).view(shape)


def draw_seeds() -> Tensor:
    """Two int32 seed words from torch's default generator (one dropout call's key)."""
    return torch.randint(-(2**31), 2**31, (2,), dtype=torch.int32)


def copy_mask(mask: Tensor) -> Tensor:
    """A copy of mask (the body of ``rltrans::saved_mask``)."""
    return mask.clone()


# A copy that Inductor cannot see through: the hash mask is computed once and saved for
# backward, neither fused into its consumer nor recomputed there (see the module docstring).
# rltrans.saved_masks removes it from rltrans' compiled programs and tags the mask instead.
saved_mask = torch.library.custom_op(
    "rltrans::saved_mask", copy_mask, mutates_args=(), device_types="cpu"
)


@saved_mask.register_fake
def _saved_mask_shape(t: Tensor) -> Tensor:
    return torch.empty_like(t)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of x with drop probability p (identity when not training or p = 0)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    # The scaled keep mask: 1 / (1 - p) with probability 1 - p, else 0 (no gradient), in
    # float32 whatever x's dtype, so a half-precision x still keeps with probability 1 - p.
    compiling = torch.compiler.is_compiling()
    if compiling and x.numel() < MAX_COUNTER:
        keep = saved_mask(hash_keep(x.shape, draw_seeds(), p))
    else:
        u = torch.rand_like(x, dtype=torch.float32, memory_format=torch.contiguous_format)
        # Compiled graphs take the opaque op; eager fills u in place (the op adds ~25 us).
        keep = keep_mask(u, p) if compiling else u.ge_(p).mul_(1.0 / (1.0 - p))
    return x * (keep if keep.dtype == x.dtype else keep.to(x.dtype))


class Dropout(nn.Module):
    """Module form of :func:`dropout` (a drop-in for ``nn.Dropout``)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Drop elements while training."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        """Show p like nn.Dropout."""
        return f"p={self.p}"
