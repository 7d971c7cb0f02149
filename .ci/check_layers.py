#!/usr/bin/env python3
"""Run rltrans's import-linter contracts ([tool.importlinter] in pyproject.toml) on a staged copy.

grimp (import-linter's graph builder) reads the folder it finds for `rltrans`. In the checkout,
and in an editable install, that folder lacks agents/ and envs/ (setuptools' package-dir maps
them into rltrans only when it builds a wheel), so lint-imports cannot run there. This script
copies an importable rltrans into a temporary directory and runs lint-imports with that
directory as the working directory (lint-imports puts it first on sys.path, ahead of any
installed or editable rltrans):

    python .ci/check_layers.py                   # copy the installed rltrans (a wheel install)
    python .ci/check_layers.py --source .        # stage the checkout with pyproject's package-dir
    python .ci/check_layers.py --prove [...]     # show the contracts bite (see below)

--prove adds, one at a time, an import that each contract forbids (an upward import into the
core, envs importing agents, learning importing envs, the core or a buffer importing the
speed seam, a module placed in no layer) and fails
unless lint-imports reports that import as broken. It passes whether or not the unmodified
tree keeps the contracts (the refactor toward the layers may be under way).
Exit status: lint-imports' own without --prove; 0/1 with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")

# (file to edit, line to append, text lint-imports must print, what the injection shows)
INJECTIONS = [
    (
        "rltrans/core/attention.py",
        "import rltrans.train",
        "rltrans.core.attention -> rltrans.train",
        "an upward import (core -> CLI) breaks the layers",
    ),
    (
        "rltrans/envs/__init__.py",
        "import rltrans.agents",
        "rltrans.envs -> rltrans.agents",
        "envs importing agents breaks agents | envs independence",
    ),
    (
        "rltrans/learners/base.py",
        "import rltrans.envs",
        "rltrans.learners.base -> rltrans.envs",
        "learning importing envs breaks the forbidden contract",
    ),
    (
        "rltrans/core/attention.py",
        "import rltrans.accel",
        "rltrans.core.attention -> rltrans.accel",
        "the core importing the speed seam breaks the layers and the accel contract",
    ),
    (
        "rltrans/buffers/rollout.py",
        "import rltrans.accel.chunks",
        "rltrans.buffers.rollout -> rltrans.accel.chunks",
        "a buffer importing the speed seam breaks the accel contract",
    ),
    (
        "rltrans/config/keys.py",
        "import rltrans.run.checkpoint",
        "rltrans.config.keys -> rltrans.run.checkpoint",
        "the config importing the run layer breaks the layers",
    ),
    (
        "rltrans/stray.py",
        "",
        "rltrans.stray",
        "a module in no layer breaks the exhaustive layers contract",
    ),
]


def stage(dest: Path, source: Path | None) -> Path:
    """Copy rltrans into dest/rltrans: a checkout (package-dir mapping) or the installed one."""
    target = dest / "rltrans"
    if source is None:
        spec = importlib.util.find_spec("rltrans")
        if spec is None or spec.origin is None:
            sys.exit("check_layers: rltrans is not installed (or pass --source CHECKOUT)")
        installed = Path(spec.origin).parent
        if not (installed / "agents").is_dir():
            sys.exit(
                f"check_layers: {installed} has no agents/ (an editable install?); "
                "install the wheel or pass --source CHECKOUT"
            )
        shutil.copytree(installed, target, ignore=IGNORE)
        return target
    setuptools_cfg = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = setuptools_cfg["package-dir"]
    # parents before children: copying rltrans first, then agents/ into rltrans/agents, ...
    for package in sorted(package_dir, key=lambda name: name.count(".")):
        if package.split(".")[0] != "rltrans":
            continue
        shutil.copytree(
            source / package_dir[package],
            dest.joinpath(*package.split(".")),
            ignore=IGNORE,
            dirs_exist_ok=True,
        )
    return target


def lint(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    if exe is None:
        sys.exit("check_layers: lint-imports not found (pip install import-linter)")
    return subprocess.run(
        [exe, "--config", str(config), "--no-cache"], cwd=cwd, capture_output=True, text=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="stage this checkout instead of copying the installed rltrans",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="pyproject.toml with [tool.importlinter] (default: the checkout's)",
    )
    parser.add_argument(
        "--prove",
        action="store_true",
        help="inject forbidden imports and check that each is reported",
    )
    args = parser.parse_args()
    source = args.source.resolve() if args.source else None
    config = (args.config or (source or ROOT) / "pyproject.toml").resolve()

    if not args.prove:
        with tempfile.TemporaryDirectory(prefix="rltrans-layers-") as tmp:
            stage(Path(tmp), source)
            result = lint(Path(tmp), config)
        sys.stdout.write(result.stdout + result.stderr)
        return result.returncode

    failures = 0
    with tempfile.TemporaryDirectory(prefix="rltrans-layers-") as tmp:
        base = Path(tmp) / "base"
        stage(base, source)
        baseline = lint(base, config)
        baseline_out = baseline.stdout + baseline.stderr
        if "Missing layer" in baseline_out or "Contracts:" not in baseline_out:
            sys.stdout.write(baseline_out)
            print("check_layers: the contracts did not run on the unmodified tree")
            return 1
        for i, (rel, line, expected, meaning) in enumerate(INJECTIONS):
            tree = Path(tmp) / f"inject{i}"
            shutil.copytree(base, tree)
            path = tree / rel
            text = path.read_text() if path.exists() else ""
            path.write_text(text + ("\n" if text and not text.endswith("\n") else "") + line + "\n")
            result = lint(tree, config)
            out = result.stdout + result.stderr
            ok = result.returncode != 0 and expected in out and expected not in baseline_out
            print(
                f"{'ok  ' if ok else 'FAIL'} {meaning}: `{line or '(new file)'}` in {rel}"
                f" -> lint-imports exit {result.returncode}"
                + (f", reports '{expected}'" if expected in out else ", not reported")
            )
            if not ok:
                sys.stdout.write(out)
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
