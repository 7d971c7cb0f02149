"""Packaging: one import namespace (rltrans.agents / rltrans.envs / rltrans.configs).

pyproject.toml maps the top-level agents/, envs/ and configs/ folders into rltrans with an
explicit `packages` list; these tests keep that list, the package data and the installed
namespace honest. Building and installing the wheel is slow and lives in .ci/run (plus one
`slow` test here); the import-layer contracts run there too, on the installed wheel.
"""

from __future__ import annotations

import glob
import importlib.resources
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
CONFIGS = ROOT / "configs"
EXPECTED_MAPPING = {
    "rltrans": "rltrans",
    "rltrans.agents": "agents",
    "rltrans.envs": "envs",
    "rltrans.configs": "configs",
}


def _clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH: test what is installed, not what is on a path."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _data_packages() -> set[str]:
    """Dotted names of the config folders below configs/ (YAML only, no __init__.py)."""
    return {
        "rltrans.configs." + ".".join(d.relative_to(CONFIGS).parts)
        for d in CONFIGS.rglob("*")
        if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.yaml"))
    }


def _packages_on_disk() -> set[str]:
    """Dotted names of every folder holding an __init__.py, under its mapped package name,
    and of the config folders (data packages: setuptools wants every importable folder)."""
    found = _data_packages()
    for package, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join((package, *rel.parts)))
    return found


def test_package_dir_maps_the_top_level_folders_into_rltrans():
    assert PACKAGE_DIR == EXPECTED_MAPPING


def test_packages_list_matches_folders_with_init():
    packages = SETUPTOOLS["packages"]
    assert len(packages) == len(set(packages)), "duplicates in [tool.setuptools] packages"
    on_disk = _packages_on_disk()
    assert set(packages) == on_disk, (
        f"missing from packages: {sorted(on_disk - set(packages))}; "
        f"listed but no __init__.py: {sorted(set(packages) - on_disk)}"
    )


def test_every_config_yaml_is_package_data():
    globs = SETUPTOOLS["package-data"]["rltrans.configs"]
    covered = {Path(p) for pattern in globs for p in glob.glob(str(CONFIGS / pattern))}
    yamls = {p for ext in ("*.yaml", "*.yml") for p in CONFIGS.rglob(ext)}
    assert yamls, "no YAML under configs/"
    missing = sorted(str(p.relative_to(ROOT)) for p in yamls - covered)
    assert not missing, f"YAML not shipped as package data: {missing}"


def test_configs_are_readable_through_importlib_resources():
    configs = importlib.resources.files("rltrans.configs")
    names = {entry.name for entry in configs.iterdir()}
    assert {"train.yaml", "evaluate.yaml", "collect.yaml"} <= names
    groups = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert groups, "no config groups under configs/"
    for group in groups:
        assert configs.joinpath(group).is_dir(), group
        shipped = {e.name for e in configs.joinpath(group).iterdir() if e.name.endswith(".yaml")}
        assert shipped == {p.name for p in (CONFIGS / group).glob("*.yaml")}, group
        assert shipped, f"empty config group {group}"
    assert "defaults:" in configs.joinpath("train.yaml").read_text()


def test_only_the_rltrans_namespace_is_importable(tmp_path):
    """From outside the checkout: rltrans.agents/.envs/.configs import; agents, envs do not."""
    code = """
import importlib.util, sys
for name in ("agents", "envs"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        pass
    else:
        sys.exit(f"a top-level {name!r} is importable: {sys.modules[name].__file__}")
import rltrans.agents, rltrans.envs, rltrans.configs, rltrans.envs.torch_envs
assert not {"agents", "envs"} & set(sys.modules), sorted(sys.modules)
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


def test_layer_contracts_bite():
    """Each contract in [tool.importlinter] reports an import added against it.

    lint-imports cannot read the checkout or an editable install (their rltrans/ folder has no
    agents/ or envs/), so .ci/check_layers.py stages the checkout with pyproject's package-dir
    mapping. Whether today's tree keeps the contracts is .ci/run's check, not this test's.
    """
    if shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None:
        pytest.importorskip("importlinter")
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_layers.py"), "--source", str(ROOT), "--prove"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / ".ci" / "check_layers.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert len(script.INJECTIONS) >= 6
    assert result.stdout.count("ok  ") == len(script.INJECTIONS), result.stdout


def _copy_clean_tree(dest: Path) -> Path:
    """The files git tracks (or would track): no build/, *.egg-info, .venv leftovers."""
    try:
        listed = (
            subprocess.run(
                [
                    "git",
                    "ls-files",
                    "-z",
                    "--cached",
                    "--others",
                    "--exclude-standard",
                    "--exclude=.venv-ci/",
                ],
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow
def test_wheel_contents(tmp_path):
    src = _copy_clean_tree(tmp_path / "src")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = (tmp_path / "dist").glob("rltrans-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rltrans"}, tops
    for package in set(SETUPTOOLS["packages"]) - _data_packages():
        assert package.replace(".", "/") + "/__init__.py" in names, package
    for yaml in CONFIGS.rglob("*.yaml"):
        assert "rltrans/configs/" + yaml.relative_to(CONFIGS).as_posix() in names, yaml
