"""Attention core: forward+backward time and memory per position scheme, as ratios.

Shapes (issue 2): batch 64, heads 4, segment L 64, memory M 128, head dim 32.
Every row attends L queries over [memory ; current] with the causal window mask
that GTrXL training uses, including the query/key/value/output projections.
References measured in the same run: the plain SDPA path (``none``), the same
with reference math, and ``torch.nn.MultiheadAttention``.

Memory is reported two ways: bytes saved for backward (deduplicated storages;
the activation memory a training step holds, exact and machine-independent)
and, on CUDA, the peak allocated during forward+backward.

    python benchmarks/attention.py [--repeats 20] [--device cpu|cuda] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rltrans.core.attention import MultiHeadAttention, sequence_mask
from rltrans.core.position import POSITIONS, build_attention_position


def saved_bytes(fn) -> int:
    """Bytes of distinct storages autograd saves for backward while running fn."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def make_case(name: str, args, device):
    """A closure running one forward+backward of the named configuration."""
    b, h, length, mem, e = args.batch, args.heads, args.length, args.memory, args.head_dim
    d = h * e
    x = torch.randn(b, length, d, device=device, requires_grad=True)
    memory = torch.randn(b, mem, d, device=device)
    mask = sequence_mask(length, mem, window=mem, device=device)  # (1, 1, L, S)
    if name == "nn.MultiheadAttention":
        module = torch.nn.MultiheadAttention(d, h, batch_first=True).to(device)
        blocked = ~mask[0, 0]  # torch convention: True = may NOT attend

        def run():
            kv = torch.cat([memory, x], dim=1)
            out, _ = module(x, kv, kv, attn_mask=blocked, need_weights=False)
            out.sum().backward()

        return run
    position, kernel = name.split("/")
    scheme = build_attention_position(position, d, h)
    module = MultiHeadAttention(d, h, scheme, kernel=kernel).to(device)

    def run():
        out, _ = module(x, module.project_kv(memory), mask)
        out.sum().backward()

    return run


def measure(run, repeats: int, device) -> float:
    """Median seconds of one call after two warm-up calls.

    On CPU this is process CPU time, not wall time: with one thread it is the work done,
    and it does not count time the shared machine spent running other processes.
    """
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    times = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = clock()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(clock() - t0)
    return statistics.median(times)


def main() -> None:
    """Measure every scheme and print a table of ratios against the plain SDPA path."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--memory", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)

    names = [f"{pos}/sdpa" for pos in POSITIONS] + ["none/math", "xl/math", "nn.MultiheadAttention"]
    cases = {name: make_case(name, args, device) for name in names}
    # Interleave repetitions so machine noise hits every configuration alike.
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(4):
        for name, run in cases.items():
            samples[name].append(measure(run, max(1, args.repeats // 4), device))
    seconds = {name: min(v) for name, v in samples.items()}
    memory = {name: saved_bytes(run) for name, run in cases.items()}
    peak = {}
    if device.type == "cuda":
        for name, run in cases.items():
            torch.cuda.reset_peak_memory_stats()
            run()
            peak[name] = torch.cuda.max_memory_allocated() / 2**20

    base = "none/sdpa"
    print(
        f"# B={args.batch} H={args.heads} L={args.length} M={args.memory} E={args.head_dim} "
        f"device={device} threads={args.threads} torch={torch.__version__}"
    )
    header = f"{'configuration':24s} {'fwd+bwd ms':>10s} {'x none/sdpa':>11s} {'saved MiB':>10s}"
    print(header + (f" {'peak MiB':>9s}" if peak else ""))
    for name in names:
        row = (
            f"{name:24s} {seconds[name] * 1e3:10.2f} {seconds[name] / seconds[base]:11.2f} "
            f"{memory[name] / 2**20:10.1f}"
        )
        print(row + (f" {peak[name]:9.1f}" if peak else ""))
    s = args.batch * args.heads * args.length * (args.length + args.memory) * args.head_dim * 4
    print(f"# an O(L^2 x D) float32 tensor (B, H, L, S, E) would be {s / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
