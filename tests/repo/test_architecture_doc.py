"""docs/concepts/architecture.md draws the import-linter contracts CI enforces: its layer
list is pyproject.toml's, and it names every contract."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/concepts/architecture.md").read_text()
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def test_the_page_draws_the_layers_ci_checks():
    block = re.search(r"<!-- layers -->\n```text\n(.*?)```", PAGE, re.S)
    assert block is not None, "the layers block is missing"
    drawn = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    (layers,) = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    assert drawn == [" ".join(layer.split()) for layer in layers]


def test_the_page_names_every_other_contract():
    listed = PAGE[PAGE.index("<!-- contracts -->") :]
    for contract in CONTRACTS:
        if contract["type"] != "layers":
            assert f"`{contract['id']}`" in listed, contract["id"]
            for module in contract["forbidden_modules"]:
                assert module.removeprefix("rltrans.") in listed, module


def test_every_layer_is_explained():
    (layers,) = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    table = PAGE[PAGE.index("| layer | what it is |") :]
    first_cells = [row.split("|")[1] for row in table.splitlines()[2:] if row.startswith("|")]
    for layer in layers:
        names = re.split(r"\s*[|:]\s*", layer.strip())
        assert any(f"`{names[0]}`" in cell for cell in first_cells), layer
