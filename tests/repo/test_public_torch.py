"""rltrans depends on public PyTorch APIs only: no module imports or touches a private torch
path (``torch._inductor``, ``torch._dynamo``, ``torch.utils._pytree``, ...) outside a short
allow-list of documented entry points."""

import ast
from pathlib import Path

import pytest

import rltrans

ROOT = Path(__file__).resolve().parents[2]
# The library's source folders (the top-level agents/ and envs/ install inside rltrans).
SOURCES = [ROOT / "rltrans", ROOT / "agents", ROOT / "envs"]
# AOTInductor's two documented entry points (used by rltrans.accel.compile for the acting
# step, behind a version check, with a torch.compile fallback).
ALLOWED = {"torch._inductor.aoti_compile_and_package", "torch._inductor.aoti_load_package"}


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private(path: str) -> bool:
    """Whether a torch path has a private segment (``_x``, not ``__version__``)."""
    parts = path.split(".")
    return parts[0] == "torch" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]
    )


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, path) of every private torch path a module imports or reads."""
    found = []
    # Only whole chains: torch._inductor.aoti_load_package, not also its prefix torch._inductor.
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            path = dotted(node)
            if path is not None:
                found.append((node.lineno, path))
    return sorted({(line, p) for line, p in found if private(p) and p not in ALLOWED})


def test_no_private_torch_paths_outside_the_allow_list():
    files = [f for folder in SOURCES for f in sorted(folder.rglob("*.py"))]
    assert len(files) > 50 and Path(rltrans.__file__).parent == ROOT / "rltrans"
    bad = []
    for file in files:
        for line, path in private_uses(ast.parse(file.read_text(), str(file))):
            bad.append(f"{file.relative_to(ROOT)}:{line}: {path}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "import torch._dynamo",
        "from torch._inductor.custom_graph_pass import CustomGraphPass",
        "from torch.utils import _pytree",
        "import torch.utils._pytree as pytree",
        "x = torch._inductor.config.cpp_wrapper",
        "from torch._inductor import config",
        "torch._C._set_grad_enabled(True)",
    ],
)
def test_the_check_sees_each_kind_of_private_use(source):
    assert private_uses(ast.parse(source)), source


def test_the_allow_list_and_public_paths_pass():
    source = """
torch._inductor.aoti_load_package(p)
torch._inductor.aoti_compile_and_package(program, package_path=p)
torch.compile(f)
import torch.export
print(torch.__version__)
"""
    assert private_uses(ast.parse(source)) == []
