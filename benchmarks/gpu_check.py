"""One GPU check: every CUDA path of rltrans in one command, in under 10 minutes, one report.

rltrans is developed and tested on CPU machines; this is the command to run first on a
machine with a GPU. Six parts, each a subprocess with its own time limit (a part that fails
or hangs is killed and recorded, and the next part runs; all limits fit in ``TOTAL_S``):

  tests     the tests that need CUDA, any tier's (named ``*cuda*``, or skipped without CUDA)
  ppo       PPO with the learner and the torch-native T-maze envs on the GPU: SPS, and the
            env steps/s of stepping the envs alone
  device    the device rollout (its acting step replayed from a CUDA graph) against the
            generic acting loop, whole PPO updates at 4,096 envs, one run
            (``benchmarks/speed.py --vary rollout``): SPS of each and their ratio
  impala    IMPALA with a CUDA learner and two actor processes acting on CPU (runtime=process)
  dt        a Decision Transformer training step under bfloat16 autocast against
            HuggingFace's (``benchmarks/dt_throughput.py --amp``): the speed ratios
  torchrun  IMPALA with one learner per GPU, gradients all-reduced over NCCL; only when more
            than one GPU is visible

It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` (the machine: GPUs, torch,
CUDA; then each part's status, seconds, numbers and command) and one ``<part>.log`` per part
(stderr, then stdout). Run folders (checkpoints, TensorBoard events) go to a temporary folder
that is deleted at the end, so ``--out`` holds at most eight files.

    python benchmarks/gpu_check.py [--out runs/gpu_check]
                                   [--parts tests,ppo,device,impala,dt,torchrun]
    python benchmarks/gpu_check.py --dry-run     # print the commands, run nothing (any machine)

Without CUDA it prints one line saying so and exits 0. Exit code 1 when a part that ran did
not pass. ``--cuda-tests PYTEST_ARGS...`` is the pytest run of part ``tests``: pytest with
the selection of CUDA tests, e.g. ``--cuda-tests --collect-only -q tests`` lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import timed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = os.path.relpath(Path(__file__).resolve(), ROOT)
PY = sys.executable
TOTAL_S = 570  # the sum of the parts' limits: 10 minutes less ~30 s for start-up and report
MIN_PART_S = 15  # a part is skipped when less than this is left of TOTAL_S
# PPO on the GPU: enough envs that a step is not all kernel-launch latency, 12 updates
PPO_ENVS, PPO_STEPS, PPO_UPDATES, WARMUP_UPDATES = 256, 64, 12, 2
DEVICE_ENVS = 4096  # the device rollout against the generic loop, at the default agent size
IMPALA_STEPS = 32768  # 64 updates of 16 envs x 32 steps (configs/algo/impala.yaml)
COMMON = ["progress=false", "checkpoint_every=1000000", "overwrite=true", "seed=1"]


@dataclass
class Part:
    """One check: its command, its time limit and how its numbers are read back."""

    name: str
    title: str
    command: list[str]
    timeout_s: int
    read: Callable[[str, Path], dict]  # (stdout, its run folder) -> numbers for the report


# ---- reading the parts' output -------------------------------------------------------------


def summary_line(stdout: str) -> dict:
    """The last JSON line on a CLI's stdout: the summary every rltrans command ends with."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON summary line on stdout")


def read_tests(stdout: str, run: Path) -> dict:
    """Counts from pytest's JUnit XML (collection errors count as errors)."""
    suite = ET.parse(run / "cuda_tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = [
        case.get("classname", "") + "::" + case.get("name", "")
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    if passed == 0 and not failed:  # all skipped: on a GPU machine, CUDA did not work for them
        raise ValueError(f"no CUDA test ran: {counts}")
    return {"passed": passed, **counts, "failed_tests": failed}


def read_ppo(stdout: str, run: Path) -> dict:
    """Summary SPS, plus from the TensorBoard events the SPS after the warm-up updates (CUDA
    start-up and the first kernels excluded) and the env-only rate: steps per update over
    the update's env stepping time (``perf/env_ms``)."""
    s = summary_line(stdout)
    per_update = PPO_ENVS * PPO_STEPS
    t = timed(run, WARMUP_UPDATES * per_update, ("env_ms", "act_ms", "learn_ms"))
    return {
        "SPS": s["SPS"],
        "SPS_after_warmup": t["sps"],
        "env_steps_per_s": per_update / (t["env_ms"] / 1e3),
        "env_ms": t["env_ms"],
        "act_ms": t["act_ms"],
        "learn_ms": t["learn_ms"],
        "global_step": s["global_step"],
        "success_rate": s.get("success_rate"),
    }


def read_device(stdout: str, run: Path) -> dict:
    """Each path's SPS and rollout / learning times from ``speed.py --vary rollout``'s JSON,
    and the device rollout's SPS over the generic loop's."""
    rows = json.loads((run / "device.json").read_text())["rows"]
    paths = {r["rollout"]: r for r in rows}
    numbers = {
        f"{name}_{key}": round(r[key], 1)
        for name, r in paths.items()
        for key in ("SPS", "rollout_ms", "learn_ms")
    }
    return {**numbers, "device_over_generic": paths["device"]["SPS"] / paths["generic"]["SPS"]}


def read_impala(stdout: str, run: Path) -> dict:
    """Summary SPS and the learner's own rate, policy lag and wait for rollouts."""
    s = summary_line(stdout)
    t = timed(run, 4 * 512, ("learner_sps", "policy_lag", "queue_wait_ms"))
    return {
        "SPS": s["SPS"],
        "SPS_after_warmup": t["sps"],  # actor processes' start-up excluded
        **{k: t[k] for k in ("learner_sps", "policy_lag", "queue_wait_ms")},
        **{k: s.get(k) for k in ("global_step", "updates", "dropped_rollouts", "success_rate")},
    }


def read_torchrun(stdout: str, run: Path) -> dict:
    """Rank 0's summary line."""
    s = summary_line(stdout)
    return {k: s.get(k) for k in ("status", "SPS", "global_step", "updates")}


RATIO = re.compile(r"^\s+(\S.*?)\s+(\d+\.\d+)x\s+\(")


def read_dt(stdout: str, run: Path) -> dict:
    """The ratios to HF that dt_throughput prints: block medians, then the paired estimate."""
    if "transformers is NOT installed" in stdout:
        raise ValueError("transformers is not installed (pip install -e '.[bench]'): no ratio")
    ratios: dict[str, dict[str, float]] = {"ratio_to_hf": {}, "paired_ratio_to_hf": {}}
    section = None
    for line in stdout.splitlines():
        if line.startswith("ratios to HF"):
            section = "ratio_to_hf"
        elif line.startswith("paired:"):
            section = "paired_ratio_to_hf"
        elif section and (m := RATIO.match(line)):
            ratios[section][m.group(1)] = float(m.group(2))
    if not ratios["ratio_to_hf"]:
        raise ValueError("no ratio lines in dt_throughput's output")
    return ratios


# ---- the plan ------------------------------------------------------------------------------


def plan(runs: Path, gpus: int) -> list[Part]:
    """The parts in order; run folders under ``runs``; ``gpus`` learners for torchrun."""
    train = [PY, "-m", "rltrans.train"]
    ppo = [
        *train, "device=cuda", "env=tmaze", f"env.num_envs={PPO_ENVS}",
        f"algo.num_steps={PPO_STEPS}", f"total_steps={PPO_ENVS * PPO_STEPS * PPO_UPDATES}",
        "compile=false", "tensorboard=true", f"run_dir={runs / 'ppo'}", *COMMON,
    ]  # fmt: skip
    device = [
        PY, "benchmarks/speed.py", "--vary", "rollout", "--device", "cuda",
        "--envs", str(DEVICE_ENVS), "--agents", "gtrxl+long", "--updates", "2",
        "--out", str(runs / "device" / "device.json"),
    ]  # fmt: skip
    # Actor processes always act on CPU with a CPU copy of the weights (rltrans.runtime.process).
    impala = [
        *train, "algo=impala", "runtime=process", "runtime.num_actors=2", "device=cuda",
        "env=tmaze", f"total_steps={IMPALA_STEPS}", "tensorboard=true",
        f"run_dir={runs / 'impala'}", *COMMON,
    ]  # fmt: skip
    dt = [
        PY, "benchmarks/dt_throughput.py", "--device", "cuda", "--amp", "--steps", "10",
        "--rounds", "3", "--pairs", "30", "--profile-steps", "0",
    ]  # fmt: skip
    tests = [
        PY, SCRIPT, "--cuda-tests", "-q", "-p", "no:cacheprovider", "-m", "not slow and not docs",
        "--continue-on-collection-errors", f"--junitxml={runs / 'tests' / 'cuda_tests.xml'}",
        "tests",
    ]  # fmt: skip
    # torchrun's module form, so that the learners run in this Python environment.
    nccl = [
        PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
        "-m", "rltrans.train", "algo=impala", "device=cuda", "env=tmaze",
        f"total_steps={gpus * 8192}", "tensorboard=false", f"run_dir={runs / 'torchrun'}",
        *COMMON,
    ]  # fmt: skip
    return [
        Part("tests", "tests that need CUDA (pytest)", tests, 90, read_tests),
        Part("ppo", "PPO, learner and torch-native envs on the GPU", ppo, 90, read_ppo),
        Part("device", "device rollout vs generic loop, 4,096 envs", device, 90, read_device),
        Part("impala", "IMPALA, CUDA learner, 2 CPU actor processes", impala, 90, read_impala),
        Part("dt", "DT training step, bf16 autocast, vs HF", dt, 120, read_dt),
        Part("torchrun", f"IMPALA, {gpus} learners over NCCL", nccl, 90, read_torchrun),
    ]


# ---- running -------------------------------------------------------------------------------


def run_part(part: Part, out: Path, runs: Path, left_s: float) -> dict:
    """Run one part in its own process group under min(its limit, ``left_s``); never raises.
    Returns its record: status passed | failed | timeout | skipped, seconds, numbers."""
    timeout = int(min(part.timeout_s, left_s))
    if timeout < MIN_PART_S:
        return skipped(part, f"{left_s:.0f} s left of {TOTAL_S} s")
    record = {**skipped(part, None), "timeout_s": timeout}
    (runs / part.name).mkdir(parents=True, exist_ok=True)
    log = out / f"{part.name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with log.open("w") as stderr:
        # A session of its own: on a timeout the whole group goes (actors, torchrun workers).
        proc = subprocess.Popen(
            part.command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            stdout, _ = proc.communicate(timeout=timeout)
            status = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            kill_group(proc.pid)  # also what a finished part left running
        if status == "timeout":
            stdout, _ = proc.communicate()
    record |= {"seconds": round(time.perf_counter() - start, 1), "returncode": proc.returncode}
    with log.open("a") as f:
        f.write(f"\n---- stdout ----\n{stdout}")
    try:  # a failed part's numbers too where it has them (pytest's counts)
        record["numbers"] = part.read(stdout, runs / part.name)
    except Exception as e:
        if status == "passed":  # a run that passed but printed nothing readable
            status, record["error"] = "failed", f"reading its output: {type(e).__name__}: {e}"
    if status == "timeout":
        record["error"] = f"killed after {timeout} s"
    elif status == "failed" and record["error"] is None:
        record["error"] = f"exit code {proc.returncode}: {tail(log)}"
    return record | {"status": status}


def kill_group(pgid: int) -> None:
    """SIGKILL the process group that ``run_part`` started (gone already: nothing)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def tail(log: Path, lines: int = 15) -> str:
    """The last lines of a part's stderr (the log holds stderr first)."""
    text = log.read_text(errors="replace").split("\n---- stdout ----\n")[0]
    return "\n".join(text.rstrip().splitlines()[-lines:])


def machine() -> dict:
    """What the report is about: GPUs, torch, CUDA, cuDNN, NCCL, driver, CPUs, commit."""
    import torch

    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    info = {
        "gpus": [f"{p.name} ({p.total_memory >> 30} GiB, sm_{p.major}{p.minor})" for p in props],
        "gpu_count": len(props),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }  # fmt: skip
    try:
        version = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
    except Exception:
        info["nccl"] = None
    smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    info["driver"] = command_output(smi)
    info["commit"] = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return info


def command_output(command: list[str]) -> str | None:
    """First line of a helper command's output, or None when it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


# ---- the report ----------------------------------------------------------------------------


def fmt(value: object) -> str:
    """A number as the report prints it: 3 significant digits, thousands kept whole."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return "[" + "; ".join(f"{k} {fmt(v)}" for k, v in value.items()) + "]"
    return str(value)


def write_report(out: Path, info: dict, records: list[dict], seconds: float) -> None:
    """gpu_check.json (everything) and gpu_check.md (a table, then commands and errors)."""
    report = {"machine": info, "seconds": round(seconds, 1), "parts": records}
    report["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    gpus = ", ".join(info["gpus"]) or "no GPU"
    lines = [
        "# GPU check", "",
        f"{gpus} | torch {info['torch']} | CUDA {info['cuda']} | cuDNN {info['cudnn']} | "
        f"NCCL {info.get('nccl')} | driver {info.get('driver')} | {info['cpus']} CPUs | "
        f"Python {info['python']} | commit {info.get('commit')} | {report['date']}, "
        f"{seconds:.0f} s in all", "",
        "| part | status | seconds | numbers |", "|---|---|---|---|",
    ]  # fmt: skip
    for r in records:
        numbers = ", ".join(f"{k} {fmt(v)}" for k, v in r["numbers"].items() if v not in ([], None))
        lines.append(f"| {r['name']}: {r['title']} | {r['status']} | {r['seconds']} | {numbers} |")
    lines += ["", "## Commands", ""]
    lines += [f"- {r['name']} (limit {r['timeout_s']} s): `{r['command']}`" for r in records]
    for r in (r for r in records if r["error"]):
        lines += ["", f"## {r['name']}: {r['status']}", "", "```", r["error"], "```"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


# ---- the CUDA test selection (part "tests") ------------------------------------------------


class CudaSelection:
    """pytest plugin: keep the tests that need CUDA, i.e. whose function name says ``cuda``
    or that carry a ``skipif`` naming CUDA (``tests/envs/test_torch_envs.py``'s marker). So a
    test that runs only without CUDA names neither (``tests/cli/test_gpu_check.py``)."""

    @staticmethod
    def needs_cuda(item) -> bool:
        if "cuda" in getattr(item, "originalname", item.name).lower():
            return True
        for mark in item.iter_markers("skipif"):
            text = " ".join(map(str, mark.args)) + " " + str(mark.kwargs.get("reason", ""))
            if "cuda" in text.lower():
                return True
        return False

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep = [i for i in items if self.needs_cuda(i)]
        config.hook.pytest_deselected(items=[i for i in items if not self.needs_cuda(i)])
        items[:] = keep


def cuda_tests(args: list[str]) -> int:
    """pytest with ``args`` on the CUDA tests only; pytest's exit code (5: none selected)."""
    import pytest

    return int(pytest.main(args, plugins=[CudaSelection()]))


# ---- main ----------------------------------------------------------------------------------


def main() -> int:
    """Parse, then the dry run, the no-CUDA line, or the parts and the report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check"), help="report folder")
    parser.add_argument("--parts", default="tests,ppo,device,impala,dt,torchrun", help="comma list")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--cuda-tests", nargs=argparse.REMAINDER, metavar="PYTEST_ARGS",
        help="run pytest with these arguments on the CUDA tests only (part 'tests')",
    )  # fmt: skip
    args = parser.parse_args()
    if args.cuda_tests is not None:
        return cuda_tests(args.cuda_tests)
    names = args.parts.split(",")
    known = [p.name for p in plan(Path("."), 2)]
    if unknown := sorted(set(names) - set(known)):
        parser.error(f"--parts: unknown {unknown}; valid: {','.join(known)}")
    import torch  # after the argument checks: a typo costs no torch import

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.dry_run:
        runs = Path(tempfile.gettempdir()) / "gpu_check-XXXX"
        for part in (p for p in plan(runs, max(gpus, 2)) if p.name in names):
            note = "  # only with more than one GPU; K = their count" * (part.name == "torchrun")
            print(f"{part.name} (limit {part.timeout_s} s): {shlex.join(part.command)}{note}")
        return 0
    if not gpus:
        print(f"gpu_check: needs CUDA (torch {torch.__version__} sees no GPU); nothing run")
        return 0
    return check(args.out.resolve(), names, gpus)


def check(out: Path, names: list[str], gpus: int) -> int:
    """Run the parts in ``names`` one after the other and write the report; 1 if any failed."""
    out.mkdir(parents=True, exist_ok=True)
    start, info, records = time.perf_counter(), machine(), []
    print(f"gpu_check: {', '.join(info['gpus'])} | torch {info['torch']} | CUDA {info['cuda']}")
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        for part in (p for p in plan(Path(tmp), gpus) if p.name in names):
            if part.name == "torchrun" and gpus < 2:
                records.append(skipped(part, "one GPU visible"))
                continue
            left = TOTAL_S - (time.perf_counter() - start)
            records.append(run_part(part, out, Path(tmp), left))
            r = records[-1]
            print(f"  {r['name']:9s} {r['status']:8s} {r['seconds']:6.1f} s  {fmt(r['numbers'])}")
    write_report(out, info, records, time.perf_counter() - start)
    print(f"gpu_check: report in {out / 'gpu_check.md'}")
    return int(any(r["status"] not in ("passed", "skipped") for r in records))


def skipped(part: Part, why: str | None) -> dict:
    """The record of a part that was not run (``run_part`` fills in the rest of one that is)."""
    return {
        "name": part.name, "title": part.title, "command": shlex.join(part.command),
        "timeout_s": part.timeout_s, "status": "skipped", "returncode": None, "seconds": 0.0,
        "numbers": {}, "error": why,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
