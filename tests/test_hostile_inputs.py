"""Hostile inputs, one test per way they got past the checks: a file that grants trust, values
that ended in a traceback instead of one ``error:`` line, weights that are not numbers, and
settings that open windows or hide an edit.

Every refusal is exit code 2 with one ``error:`` line on stderr and no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import tests.test_trust as trust_tests
from rltrans.train import main as train_main

MARKER = trust_tests.MARKER
DT_TINY = trust_tests.DT_TINY
copy_run, edit_both = trust_tests.copy_run, trust_tests.edit_both
edit_eval_spec, error_text = trust_tests.edit_eval_spec, trust_tests.error_text
# The fixtures of the trust tests, shared by name.
cartpole_run, dataset, marker = trust_tests.cartpole_run, trust_tests.dataset, trust_tests.marker

WRAP = [{"name": "x", "entry_point": f"{MARKER}:Wrap", "kwargs": {}}]


def refused(capsys) -> str:
    """stderr of a command refused with exit code 2: one error line, no traceback."""
    err = error_text(capsys)
    assert "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- trust


def _grant_trust_in_files(run: Path) -> None:
    """What a hostile run folder says: trust_env_code: true in config.yaml and checkpoint."""
    edit_both(run, lambda c: c.update(trust_env_code=True))


def test_a_run_folder_never_grants_trust_to_an_offline_resume(dataset, marker, tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}"]) == 0
    capsys.readouterr()
    edit_eval_spec(dataset, additional_wrappers=WRAP)  # the data now names code
    _grant_trust_in_files(run)
    assert train_main(["resume=true", f"run_dir={run}", "train_steps=8"]) == 2
    assert "trust_env_code=true" in refused(capsys)
    assert not marker.exists(), "code named by the dataset was imported"
    # the command line of this process may grant it
    args = ["resume=true", f"run_dir={run}", "train_steps=8", "trust_env_code=true"]
    assert train_main(args) == 0
    assert marker.exists()


def test_trust_given_once_is_not_kept_by_later_resumes(dataset, marker, tmp_path, capsys):
    edit_eval_spec(dataset, additional_wrappers=WRAP)
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}", "trust_env_code=true"]) == 0
    capsys.readouterr()
    marker.unlink()
    sys.modules.pop(MARKER, None)
    assert train_main(["resume=true", f"run_dir={run}", "train_steps=8"]) == 2
    assert "trust_env_code=true" in refused(capsys)
    assert not marker.exists()


def test_an_online_resume_takes_trust_from_the_command_line_only(
    cartpole_run, marker, tmp_path, capsys
):
    run = copy_run(cartpole_run, tmp_path / "run")
    edit_both(run, lambda c: c.update(trust_env_code=True))
    edit_both(run, lambda c: c["env"].update(id=f"{MARKER}:Marked-v0"))
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert "trust_env_code=true" in refused(capsys)
    assert not marker.exists()
