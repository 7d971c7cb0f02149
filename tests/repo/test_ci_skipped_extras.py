""".ci/skipped_extras.py: from the README venv's JUnit report, the tests skipped for a missing
extra (run again in CI's venv with every extra); a missing GPU is not an extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("", "tests.envs.test_atari", '<skipped message="collection skipped"/>'),
    (
        "tests.envs.test_minigrid",
        "test_x[a-1]",
        "<skipped message=\"could not import 'minigrid'\"/>",
    ),
    ("tests.learners.test_amp", "test_cuda", '<skipped message="CUDA not available"/>'),
    ("tests.envs.test_minigrid", "test_ran", ""),
]
REPORT = "<testsuites><testsuite>{}</testsuite></testsuites>".format(
    "".join(f'<testcase classname="{c}" name="{n}">{body}</testcase>' for c, n, body in CASES)
)


def test_the_extras_skips_are_listed_as_node_ids_and_gpu_skips_are_not(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("skipped_extras", ROOT / ".ci/skipped_extras.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    assert module.main(str(report), str(ROOT)) == 0
    assert capsys.readouterr().out.split() == [
        "tests/envs/test_atari.py",
        "tests/envs/test_minigrid.py::test_x[a-1]",
    ]
