"""The library stays readable in pieces: no module over 500 lines and no function over 80 in
rltrans/, agents/ or envs/. A longer one is split by concern, not by size."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("rltrans", "agents", "envs") for p in (ROOT / d).rglob("*.py"))
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def test_no_module_is_over_500_lines():
    long = {}
    for path in SOURCES:
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            long[str(path.relative_to(ROOT))] = lines
    assert not long, long


def test_no_function_is_over_80_lines():
    long = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, long
