"""Rollout minibatches: every segment once per epoch, equal to naive per-segment slices of the
(T, N) storage with its stored memory, images kept uint8."""

from __future__ import annotations

import torch

from rltrans.buffers.rollout import RolloutBuffer


def filled_buffer(steps: int = 8, envs: int = 3, length: int = 4) -> RolloutBuffer:
    g = torch.Generator().manual_seed(0)
    buf = RolloutBuffer(steps, envs, length, "cpu")
    for t in range(steps):
        if t % length == 0:  # a memory tree per segment, (N, ...) leaves
            buf.record_memory(t, (torch.randn(envs, 2, 5, generator=g), torch.full((envs,), t)))
        obs = {
            "image": torch.randint(0, 256, (envs, 6, 6, 3), generator=g).to(torch.uint8),
            "vector": torch.randn(envs, 4, generator=g),
        }
        action = torch.randint(0, 4, (envs,), generator=g)
        starts = torch.rand(envs, generator=g) < 0.3
        buf.record_step(t, obs, starts, action, torch.randn(envs, generator=g), torch.randn(envs))
        buf.record_outcome(t, torch.randn(envs, generator=g), starts, ~starts, torch.zeros(envs))
    buf.compute_advantages(torch.randn(envs, generator=g), gamma=0.9, lam=0.8)
    return buf


def test_minibatches_are_the_naive_segments_with_their_memory():
    buf, length, envs = filled_buffer(), 4, 3
    seen = []
    for batch in buf.minibatches(2, torch.Generator().manual_seed(1)):
        image = batch.segment.obs["image"]
        assert image.dtype == torch.uint8 and image.shape[1:] == (length, 6, 6, 3)
        for b in range(image.shape[0]):
            # find the segment by its content: (k, n) with equal image steps
            matches = [
                (k, n)
                for k in range(2)
                for n in range(envs)
                if torch.equal(buf.obs["image"][k * length : (k + 1) * length, n], image[b])
            ]
            assert len(matches) == 1
            k, n = matches[0]
            seen.append((k, n))
            window = slice(k * length, (k + 1) * length)
            assert torch.equal(batch.segment.obs["vector"][b], buf.obs["vector"][window, n])
            for got, stored in (
                (batch.segment.actions[b], buf.actions[window, n]),
                (batch.segment.starts[b], buf.starts[window, n]),
                (batch.log_probs[b], buf.log_probs[window, n]),
                (batch.values[b], buf.values[window, n]),
                (batch.advantages[b], buf.advantages[window, n]),
                (batch.returns[b], buf.returns[window, n]),
            ):
                assert torch.equal(got, stored)
            assert torch.equal(batch.segment.memory[0][b], buf.memories[k][0][n])
            assert batch.segment.memory[1][b].item() == k * length
    assert sorted(seen) == [(k, n) for k in range(2) for n in range(envs)]


def test_memoryless_minibatches_carry_the_empty_memory_and_the_same_segments():
    """A memoryless backbone's memories (an MLP's ``()``) are not gathered: its minibatches
    carry the recorded structure and are otherwise those of a buffer with memories."""
    with_memory, without = filled_buffer(), filled_buffer()
    without.memories = [() for _ in without.memories]
    pairs = zip(
        with_memory.minibatches(3, torch.Generator().manual_seed(4)),
        without.minibatches(3, torch.Generator().manual_seed(4)),
        strict=True,
    )
    for a, b in pairs:
        assert b.segment.memory == ()
        assert torch.equal(a.segment.obs["vector"], b.segment.obs["vector"])
        assert torch.equal(a.log_probs, b.log_probs)
