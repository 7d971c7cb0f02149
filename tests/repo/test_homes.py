"""Every test has an obvious home and one tier. A folder under tests/ mirrors a package
(``rltrans/<name>/``, or the top-level agents/, envs/, benchmarks/) and holds the default tier,
a file at tests/ root mirrors a module (``rltrans/<name>.py``), tests/cli/ holds the commands
and trainings run end to end and tests/repo/ the checks of the repository's files; the
conftest marks those two tiers by folder and the default run leaves them out."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SHARED = {"helpers", "data", "__pycache__"}  # no tests: what the folders share


def mirrored(name: str) -> bool:
    """Whether ``name`` is a package of rltrans or a top-level folder of the repository's code."""
    return (ROOT / "rltrans" / name / "__init__.py").is_file() or name in {
        "agents",
        "envs",
        "benchmarks",
    }


def test_each_folder_mirrors_a_package_or_is_a_tier():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir()} - SHARED
    strays = sorted(f for f in folders if f not in conftest.TIER_FOLDERS and not mirrored(f))
    assert not strays, f"tests/{strays[0]}/ mirrors no package of rltrans/ and is no tier"
    for folder in folders:
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder}/ is not a package"


def test_a_test_file_at_the_root_mirrors_a_module():
    for path in sorted(TESTS.glob("test_*.py")):
        module = ROOT / "rltrans" / path.name.removeprefix("test_")
        assert module.is_file(), f"tests/{path.name} mirrors no rltrans/{module.name}"


def item(path: Path, *marks: str) -> SimpleNamespace:
    """A collected test of ``path`` with ``marks``, as the conftest's hook reads one."""
    held = set(marks)
    return SimpleNamespace(
        path=path,
        held=held,
        get_closest_marker=lambda name: name if name in held else None,
        add_marker=held.add,
    )


@pytest.mark.parametrize(
    ("path", "marks", "tier"),
    [
        (TESTS / "cli" / "test_resume.py", (), {"cli"}),
        (TESTS / "repo" / "test_docs.py", (), {"repo"}),
        (TESTS / "core" / "test_attention.py", (), set()),
        (TESTS / "test_returns.py", (), set()),
        (TESTS / "cli" / "test_twin_learning.py", ("slow",), {"slow"}),
        (TESTS / "repo" / "test_docs.py", ("docs",), {"docs"}),
    ],
)
def test_the_conftest_marks_a_tests_tier_by_its_folder(path, marks, tier):
    collected = item(path, *marks)
    conftest.pytest_collection_modifyitems([collected])
    assert collected.held == tier


def test_the_default_run_leaves_every_other_tier_out():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = shlex.split(options["ini_options"]["addopts"])
    selected = addopts[addopts.index("-m") + 1]
    registered = {line.split(":")[0] for line in options["ini_options"]["markers"]}
    tiers = {*conftest.TIER_FOLDERS, "slow", "docs"}
    assert tiers <= registered
    assert selected == " and ".join(f"not {tier}" for tier in ("slow", "docs", "cli", "repo"))
