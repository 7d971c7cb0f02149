"""benchmarks/gpu_check.py on a CPU machine: the no-CUDA exit, the dry run, the CUDA test
selection, and that a failing or hanging part is recorded while the next parts still run."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
PARTS = ["tests", "ppo", "device", "impala", "dt", "torchrun"]


def gpu_check(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def module(monkeypatch):
    """benchmarks/gpu_check.py imported (with its folder on sys.path only for this test)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("common", None)  # its helper module, imported from that folder


# Named without "cuda" (as is its skip reason): gpu_check would select it as a CUDA test.
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    done = gpu_check("--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 and "needs CUDA" in done.stdout
    assert not (tmp_path / "report").exists()


def test_dry_run_lists_every_part_within_ten_minutes(module):
    done = gpu_check("--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == PARTS
    commands = dict(zip(PARTS, lines, strict=True))
    for needed, part in [
        ("--cuda-tests", "tests"),
        ("-m 'not slow and not docs'", "tests"),  # the CLI and repository tiers too
        ("device=cuda", "ppo"),
        ("env=tmaze", "ppo"),
        ("speed.py --vary rollout", "device"),
        ("--device cuda", "device"),
        ("runtime=process", "impala"),
        ("device=cuda", "impala"),
        ("--amp", "dt"),
        ("torch.distributed.run", "torchrun"),
    ]:
        assert needed in commands[part], (part, commands[part])
    limits = [int(re.search(r"\(limit (\d+) s\)", line).group(1)) for line in lines]
    assert sum(limits) <= module.TOTAL_S <= 600
    assert gpu_check("--dry-run", "--parts", "ppo,dt").stdout.split("\n")[1].startswith("dt ")
    assert gpu_check("--parts", "bogus").returncode == 2


def test_gpu_test_selection_keeps_tests_named_or_marked_for_the_gpu(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent("""
        import pytest

        def test_plain():
            pass

        def test_runs_on_cuda():
            pass

        @pytest.mark.skipif(True, reason="CUDA not available")
        def test_marked():
            pass

        @pytest.mark.skipif(True, reason="needs Ray")
        def test_other_skip():
            pass
        """)
    )
    done = gpu_check("--cuda-tests", "--collect-only", "-q", "-p", "no:cacheprovider", tmp_path)
    collected = sorted(line.split("::")[1] for line in done.stdout.splitlines() if "::" in line)
    assert collected == ["test_marked", "test_runs_on_cuda"], done.stdout


def test_failed_and_hanging_parts_are_recorded_and_the_rest_runs(module, monkeypatch, tmp_path):
    """One part hangs (with a child process), one exits 3, one passes but prints nothing
    readable, one passes: each is recorded, the hanging one's process group is killed."""
    pid_file = tmp_path / "child.pid"
    hang = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    crash = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    ok = "print('{\"SPS\": 12.5}')"

    def part(name: str, code: str, read=lambda stdout, run: module.summary_line(stdout)):
        return module.Part(name, name, [sys.executable, "-c", code], 2, read)

    def bad_read(stdout, run):
        raise ValueError("unreadable")

    parts = [part("hang", hang), part("crash", crash), part("bad", ok, bad_read), part("ok", ok)]
    monkeypatch.setattr(module, "plan", lambda runs, gpus: parts)
    monkeypatch.setattr(module, "MIN_PART_S", 1)
    out = tmp_path / "report"
    assert module.check(out, [p.name for p in parts], gpus=1) == 1
    report = json.loads((out / "gpu_check.json").read_text())
    records = {r["name"]: r for r in report["parts"]}
    assert [r["name"] for r in report["parts"]] == ["hang", "crash", "bad", "ok"]
    assert records["hang"]["status"] == "timeout" and records["hang"]["seconds"] < 10
    assert records["crash"]["status"] == "failed" and "boom" in records["crash"]["error"]
    assert records["bad"]["status"] == "failed" and "unreadable" in records["bad"]["error"]
    assert records["ok"]["status"] == "passed" and records["ok"]["numbers"] == {"SPS": 12.5}
    assert report["machine"]["torch"] == torch.__version__
    markdown = (out / "gpu_check.md").read_text()
    assert "| ok: ok | passed |" in markdown and "boom" in markdown
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["gpu_check.json", "gpu_check.md", "hang.log", "crash.log", "bad.log", "ok.log"]
    )
    child = int(pid_file.read_text())  # the hanging part's child went with its group
    status = Path(f"/proc/{child}/status")
    assert not status.exists() or "zombie" in status.read_text()
