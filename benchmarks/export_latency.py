"""Acting latency of an exported policy in ONNX Runtime against ``load_policy``, same run.

For each agent (its shipped config, ``agent=gtrxl`` etc., trained for one tiny update on the
T-maze so that a real checkpoint exists), the checkpoint is exported to ONNX
(``rltrans.export``) and both act at batch 1 and 16 on the same observations with episode
starts at random (p = 0.05 per env and step): ``load_policy(..., torch_threads=1).act`` on
NumPy observations (NumPy action out, the Python user's call) and the ONNX Runtime session on
the CPU with one intra-op thread, its state fed back by hand as the deploy guide's loop does.
Blocks of ``--block`` steps alternate between the two, ``--rounds`` times; the median ms per
step of each is kept and the ratio ONNX Runtime / load_policy printed (below 1: faster).

Printed: one markdown table (agent, batch, ms per step of each, the ratio), also written as
JSON to ``--out``.

    python benchmarks/export_latency.py [--agents gtrxl gru lstm mlp ut_act] [--batches 1 16]
                                        [--block 200] [--rounds 5] [--out runs/export.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import rltrans
from rltrans.policy import load_policy
from rltrans.train import main as train_main

ONE_UPDATE = [
    "env=tmaze",
    "env.num_envs=2",
    "algo.num_steps=8",
    "algo.num_minibatches=1",
    "algo.epochs=1",
    "total_steps=16",
    "progress=false",
    "tensorboard=false",
]


def tiny_checkpoint(agent: str, folder: Path) -> Path:
    """A run of ``agent=<agent>`` with its shipped sizes, one tiny update long."""
    run = folder / agent
    assert train_main([f"agent={agent}", *ONE_UPDATE, f"run_dir={run}"]) == 0
    return run


def time_blocks(step, block: int) -> float:
    """ms per call of ``step`` over ``block`` calls."""
    start = time.perf_counter()
    for i in range(block):
        step(i)
    return (time.perf_counter() - start) / block * 1e3


def latency(run: Path, program: Path, batch: int, block: int, rounds: int) -> dict[str, float]:
    """Median ms per acting step of load_policy and of ONNX Runtime at ``batch`` envs."""
    policy = load_policy(run, torch_threads=1)
    meta = json.loads(Path(str(program) + ".json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(program), options, providers=["CPUExecutionProvider"])
    names = [t["name"] for t in meta["outputs"]]
    states = [t for t in meta["outputs"] if t["role"] == "state"]
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 2, (block, batch, 4)).astype(np.float32)
    starts = rng.random((block, batch)) < 0.05
    feeds = {
        t["name"]: np.full((batch, *t["shape"][1:]), t["initial"], t["dtype"])
        for t in meta["inputs"]
        if t["role"] == "state"
    }
    held = {"state": policy.initial_state(batch)}

    def torch_step(i: int) -> None:
        _, held["state"] = policy.act(obs[i], held["state"], starts[i])

    def onnx_step(i: int) -> None:
        feeds.update(obs=obs[i], episode_start=starts[i])
        out = dict(zip(names, session.run(names, feeds), strict=True))
        feeds.update({t["pairs"]: out[t["name"]] for t in states})

    time_blocks(torch_step, 20), time_blocks(onnx_step, 20)  # warm-up
    torch_ms, onnx_ms = [], []
    for _ in range(rounds):  # interleaved, so a slow spell of the machine hits both
        torch_ms.append(time_blocks(torch_step, block))
        onnx_ms.append(time_blocks(onnx_step, block))
    a, b = statistics.median(torch_ms), statistics.median(onnx_ms)
    return {"load_policy_ms": a, "onnxruntime_ms": b, "ratio": b / a}


def main() -> None:
    """Parse, export, time, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=["gtrxl", "gru", "lstm", "mlp", "ut_act"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for agent in args.agents:
            run = tiny_checkpoint(agent, Path(folder))
            program = Path(folder) / f"{agent}.onnx"
            rltrans.export(run, program)
            for batch in args.batches:
                result = latency(run, program, batch, args.block, args.rounds)
                rows.append({"agent": agent, "batch": batch, **result})
    print("| agent | batch | load_policy ms | ONNX Runtime ms | ONNX Runtime / load_policy |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['agent']} | {r['batch']} | {r['load_policy_ms']:.3f} | "
            f"{r['onnxruntime_ms']:.3f} | {r['ratio']:.2f} |"
        )
    if args.out is not None:
        meta = {"torch": torch.__version__, "onnxruntime": ort.__version__}
        meta |= {"machine": platform.processor() or platform.machine()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
