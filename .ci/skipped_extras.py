"""Print the pytest node ids that a JUnit report (``pytest --junitxml``) shows as skipped for
a missing optional extra, one per line: CI runs the README's test command in a venv with the
README's install (torch + ``.[dev]``), then runs these again in the venv with every extra.

A skip for a missing GPU is not an extra (no CI machine has one), so it is left out. A module
skipped as a whole (``pytest.importorskip`` at its top) is reported as its file.

    python .ci/skipped_extras.py report.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

NOT_AN_EXTRA = ("CUDA", "GPU")


def node_id(classname: str, name: str, root: Path) -> str:
    """``tests.envs.test_atari.TestX`` + ``test_y`` -> ``tests/envs/test_atari.py::TestX::test_y``;
    a module skipped at collection (no classname, its dotted path as the name) -> its file."""
    if not classname:
        return Path(*name.split(".")).with_suffix(".py").as_posix()
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    raise SystemExit(f"{classname}::{name}: no test file under {root}")


def main(report: str, root: str = ".") -> int:
    """Print the node ids; exit 0 (also when there are none)."""
    ids: list[str] = []
    for case in ET.parse(report).iter("testcase"):
        for skipped in case.findall("skipped"):
            message = skipped.get("message", "")
            if any(word in message for word in NOT_AN_EXTRA):
                continue
            found = node_id(case.get("classname", ""), case.get("name", ""), Path(root))
            if found not in ids:
                ids.append(found)
    print("\n".join(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
