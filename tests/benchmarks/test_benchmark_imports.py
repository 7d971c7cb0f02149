"""The benchmark scripts import one another without a circle: what several of them share lives
in benchmarks/common.py, which imports no other script; the only other edges are a script
handing its command line to another (memory_suite.py --suite popgym), speed.py's in-process
half (speed_inprocess.py) and popgym_suite.py's scores and report (popgym_score.py), the last
two no scripts of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SHARED = "common"


def imports(path: Path, scripts: set[str]) -> set[str]:
    """The other scripts of ``scripts`` that ``path`` imports, at the top or inside a function
    (a script runs with its folder first on ``sys.path``, so ``import x`` finds x.py there)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & scripts
    return found - {path.stem}


def graph(folder: Path = BENCHMARKS) -> dict[str, set[str]]:
    """Script -> the scripts it imports, for every ``*.py`` in ``folder``."""
    paths = sorted(folder.glob("*.py"))
    scripts = {p.stem for p in paths}
    return {p.stem: imports(p, scripts) for p in paths}


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``edges`` as the scripts along it (first == last), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_benchmark_import_graph_has_no_circle():
    edges = graph()
    assert SHARED in edges and edges  # the folder and its shared module were read
    assert circle(edges) is None, " -> ".join(circle(edges))


def test_the_shared_module_imports_no_script():
    assert graph()[SHARED] == set()


def test_every_script_that_shares_a_helper_takes_it_from_the_shared_module():
    """No script reaches into another for a helper."""
    others = {(a, b) for a, deps in graph().items() for b in deps if b != SHARED}
    assert others == {
        ("memory_suite", "popgym_suite"),
        ("popgym_suite", "popgym_score"),
        ("speed", "speed_inprocess"),
    }


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": {"a"}}, ["b", "c", "b"]),
        ({"a": {"a"}}, ["a", "a"]),
    ],
)
def test_a_circle_is_found_and_named(edges, expected):
    assert circle(edges) == expected


def test_an_import_inside_a_function_counts(tmp_path):
    (tmp_path / "one.py").write_text("def main():\n    import two\n")
    (tmp_path / "two.py").write_text("from one import main\nimport json\n")
    assert graph(tmp_path) == {"one": {"two"}, "two": {"one"}}
    assert circle(graph(tmp_path)) == ["one", "two", "one"]
