"""Hostile inputs, one test per way they got past the checks: a file that grants trust, values
that ended in a traceback instead of one ``error:`` line, weights that are not numbers, and
settings that open windows or hide an edit.

Every refusal is exit code 2 with one ``error:`` line on stderr and no traceback."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

import tests.cli.test_trust as trust_tests
from rltrans import load_policy
from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import CheckpointError
from rltrans.train import main as train_main

MARKER = trust_tests.MARKER
DT_TINY = trust_tests.DT_TINY
copy_run, edit_both = trust_tests.copy_run, trust_tests.edit_both
edit_checkpoint = trust_tests.edit_checkpoint
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


# ----------------------------------------------------------------------------- tracebacks


def _nested(depth: int) -> dict:
    node: dict = {"x": 1}
    for _ in range(depth):
        node = {"x": node}
    return node


def _save_deep(path: Path, edit) -> None:
    """Edit a checkpoint with a tree deeper than pickle's default recursion allows to save."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        edit_checkpoint(path, edit)
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("command", ["evaluate", "resume"])
def test_a_checkpoint_config_nested_600_deep_is_one_error(command, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    _save_deep(
        run / "checkpoints" / "last.pt", lambda p: p["config"]["agent"].update(x=_nested(700))
    )
    if command == "evaluate":
        assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    else:
        assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert "nested deeper than" in refused(capsys)


def test_a_config_yaml_nested_beyond_the_parser_is_one_error(cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    (run / "config.yaml").write_text("seed: " + "[" * 3000 + "]" * 3000 + "\n")
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert "nested deeper than the YAML parser" in refused(capsys)


@pytest.mark.parametrize("where", ["checkpoint", "config.yaml"])
def test_omegaconfs_missing_mark_is_not_a_value(where, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    if where == "checkpoint":
        edit_checkpoint(
            run / "checkpoints" / "last.pt", lambda p: p["config"]["env"].update(id="???")
        )
        assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    else:
        text = (run / "config.yaml").read_text().replace("id: CartPole-v1", "id: ???")
        (run / "config.yaml").write_text(text)
        assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert "env.id='???': a missing value" in refused(capsys)


@pytest.mark.parametrize("where", ["env spec", "metadata"])
def test_dataset_metadata_nested_beyond_json_is_one_error(where, dataset, tmp_path, capsys):
    path = dataset / "data" / "metadata.json"
    meta = json.loads(path.read_text())
    deep = "[" * 5000 + "]" * 5000  # beyond the json parser's recursion
    if where == "env spec":
        meta["eval_env_spec"] = meta["eval_env_spec"].replace(
            '"kwargs": {}', f'"kwargs": {{"x": {deep}}}'
        )
        assert deep in meta["eval_env_spec"]
        path.write_text(json.dumps(meta))
    else:
        path.write_text(json.dumps(meta)[:-1] + f', "extra": {deep}}}')
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}"]) == 2
    assert "dataset 'rltrans/cp-v0' cannot be read (RecursionError" in refused(capsys)
    assert not run.exists()


@pytest.fixture(scope="module")
def dt_run(tmp_path_factory) -> Path:
    """A tiny finished DT run on a CartPole dataset collected here."""
    root = tmp_path_factory.mktemp("dt")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root / "minari"))
    collect = [
        "dataset_id=rltrans/hi-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "episodes=4",
        "num_envs=2",
        "max_episode_steps=30",
        "progress=false",
    ]
    assert collect_main(collect) == 0
    tiny = [a.replace("cp-v0", "hi-v0") for a in DT_TINY]
    assert train_main([*tiny, f"run_dir={root / 'run'}"]) == 0
    yield root / "run"
    mp.undo()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("eval_targets", "abc", "eval_targets='abc'"),
        ("eval_targets", [float("nan")], "eval_targets=[nan]"),
        ("eval_targets", [1.0, "x"], "finite numbers"),
        ("dataset", [1, 2], "dataset=[1, 2]: expected a mapping"),
        ("dataset", {"max_return": "big"}, "dataset.max_return='big'"),
        ("dataset", {"episodes": -3}, "dataset.episodes=-3"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "load_policy", "collect"])
def test_every_field_of_a_dt_checkpoint_is_checked(
    command, field, value, expected, dt_run, tmp_path, capsys
):
    run = copy_run(dt_run, tmp_path / "run")
    edit_checkpoint(run / "checkpoints" / "last.pt", lambda p: p.update({field: value}))
    if command == "load_policy":
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            load_policy(run)
        return
    if command == "evaluate":
        code = evaluate_main([f"checkpoint={run}", "episodes=1"])
    else:
        out = tmp_path / "minari-out"
        args = [f"policy={run}", "dataset_id=rltrans/hi-out-v0", "episodes=1", "progress=false"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MINARI_DATASETS_PATH", str(out))
            code = collect_main(args)
    assert code == 2
    assert expected in refused(capsys)


@pytest.mark.parametrize(
    ("part", "value", "expected"),
    [
        ("update", "abc", "update='abc': expected an integer in [0, 2^53)"),
        ("update", float("inf"), "update=inf: expected an integer in [0, 2^53)"),
        ("global_step", "12", "global_step='12': expected an integer in [0, 2^53)"),
        ("sampler_rng", "{not json", "sampler_rng: not a valid pcg64 generator state (Expecting"),
        ("rng", {"python": 3}, "rng.python=3: expected a mapping"),
    ],
)
def test_a_damaged_trainer_state_on_resume_is_one_error(
    part, value, expected, dt_run, tmp_path, capsys
):
    run = copy_run(dt_run, tmp_path / "run")
    (run / "config.yaml").write_text((dt_run / "config.yaml").read_text())
    last = edit_checkpoint(run / "checkpoints" / "last.pt", lambda p: p.update({part: value}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(dt_run.parent / "minari"))
        assert train_main(["resume=true", f"run_dir={run}", "train_steps=8"]) == 2
    assert refused(capsys).startswith(f"error: checkpoint {last}: {expected}")


# ----------------------------------------------------------------------------- silent nonsense


def _poison(payload: dict) -> None:
    name = next(k for k, v in payload["model"].items() if v.is_floating_point())
    payload["model"][name] = payload["model"][name].clone().fill_(float("nan"))


@pytest.mark.parametrize("command", ["evaluate", "resume", "load_policy"])
def test_non_finite_weights_are_refused_naming_the_tensor(command, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    edit_checkpoint(run / "checkpoints" / "last.pt", _poison)
    if command == "load_policy":
        with pytest.raises(CheckpointError, match="non-finite"):
            load_policy(run)
        return
    if command == "evaluate":
        assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    else:
        assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    err = refused(capsys)
    assert "weight '" in err and "non-finite" in err


def test_a_window_opening_render_mode_from_a_file_needs_trust(cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    edit_checkpoint(
        run / "checkpoints" / "last.pt",
        lambda p: p["config"]["env"].update(kwargs={"render_mode": "human"}),
    )
    assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    err = refused(capsys)
    assert "render_mode: 'human' (opens windows)" in err and "trust_env_code=true" in err


def test_a_dotted_key_in_config_yaml_is_an_edit(cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    gamma = saved["algo"].pop("gamma")
    saved["algo.gamma"] = 0.5
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert f"algo.gamma: config.yaml 0.5, checkpoint {gamma}" in refused(capsys)
    saved["algo"]["gamma"] = gamma  # both spellings, two values
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert "algo.gamma: given twice" in refused(capsys)


def test_an_offline_evaluation_that_does_not_end_is_one_error(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}", "algo.eval_max_steps=1"]) == 2
    err = capsys.readouterr().err  # notices may come first: the error is the last line
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in err, err
    assert "exceeded max_steps=1" in last and "algo.eval_max_steps" in last


@pytest.mark.parametrize("name", ["return_scale", "state_std"])
@pytest.mark.parametrize("value", [0.0, float("nan"), -1.0])
def test_dataset_statistics_a_dt_cannot_divide_by_are_refused(
    name, value, dt_run, tmp_path, capsys
):
    run = copy_run(dt_run, tmp_path / "run")

    def edit(payload):
        payload["model"][name] = torch.full_like(payload["model"][name], value)

    edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    err = refused(capsys)
    assert name in err and ("positive and finite" in err or "non-finite" in err), err
