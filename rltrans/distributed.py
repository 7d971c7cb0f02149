"""Several learner processes (``torchrun``): who is who, and the few collectives a
data-parallel learner needs.

``torchrun --nproc_per_node=K -m rltrans.train algo=impala ...`` starts K copies of the
trainer with ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set. Each rank runs its own actors
and computes the loss of its own rollouts; :func:`all_reduce_mean_` averages the gradient
across ranks before clipping and the optimizer step, so every rank takes the same step: the
step one process would take over all ranks' rollouts at once (the loss is a mean over equal
shares). This is what ``torch.nn.parallel.DistributedDataParallel`` does, done on the
learner's one flat gradient tensor (one collective per step, DDP's single bucket) because
the learner replays segments through ``agent.evaluate`` rather than ``forward``, where DDP
hooks in. Rank 0 writes the run folder, the checkpoints and the logs.

Without ``torchrun`` (``WORLD_SIZE`` unset or 1) every function here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# How long a rank waits in a collective for the others (a dead rank is noticed by torchrun,
# which stops the group; this bounds the wait when it does not).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class World:
    """This process's place among the learner processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """True on the rank that writes the run folder, checkpoints and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one learner process."""
        return self.size > 1

    @classmethod
    def from_env(cls) -> World:
        """The world ``torchrun`` describes in the environment (one process without it)."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size <= 1:
            return cls()
        return cls(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")))


def init(world: World, device: torch.device) -> None:
    """Join the process group (gloo for CPU learners, nccl for CUDA ones); no-op alone."""
    if not world.distributed or dist.is_initialized():
        return
    # Import torch.distributed.nn.functional before joining, never after. Its functions take
    # ``group.WORLD`` as a default argument, and torch's compiler stack (compile=auto loads it)
    # imports it: imported while a group exists, it holds the group, destroy_process_group no
    # longer frees it, and gloo's worker threads outlive it into interpreter shutdown, where
    # releasing the last collective's tensors aborts the process ("terminate called without
    # an active exception") now and then, after a run that finished.
    import torch.distributed.nn.functional  # noqa: F401

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, rank=world.rank, world_size=world.size, timeout=COLLECTIVE_TIMEOUT
    )


def active() -> bool:
    """True inside an initialized group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_mean_(tensor: Tensor) -> Tensor:
    """Replace ``tensor`` by its mean over the ranks, in place (no-op alone)."""
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(dist.get_world_size())
    return tensor


def all_true(flag: bool) -> bool:
    """True when ``flag`` is true on every rank (``flag`` alone)."""
    if not active():
        return flag
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def all_reduce_grads_(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients of ``params`` over the ranks in one collective."""
    if not active():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if len(grads) == 1:
        all_reduce_mean_(grads[0])
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_mean_(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_module_(module: torch.nn.Module, *, buffers_only: bool = False) -> None:
    """Give every rank rank 0's parameters (unless ``buffers_only``) and buffers."""
    if not active():
        return
    tensors = list(module.buffers()) if buffers_only else [*module.parameters(), *module.buffers()]
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=0)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable values; no-op alone)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` alone)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait until every rank gets here (no-op alone)."""
    if active():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (no-op when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
