"""The export tests' shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory) -> Iterator[Path]:
    """Minari's datasets in a folder of this module's own."""
    root, before = tmp_path_factory.mktemp("minari"), os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    yield root
    if before is None:
        del os.environ["MINARI_DATASETS_PATH"]
    else:
        os.environ["MINARI_DATASETS_PATH"] = before
