"""python -m rltrans.export: the torch.export archive equals load_policy over whole episodes,
the sidecar describes every tensor and the spaces, and bad command lines fail in one line."""

from __future__ import annotations

import json

import pytest

from rltrans.config import config_specs, default_config, load_config
from rltrans.deploy.write import acting_program
from rltrans.envs.torch_envs import make_torch_env
from rltrans.export import main
from rltrans.policy import load_policy
from rltrans.spaces import deserialize_space
from rltrans.version import __version__
from tests.deploy.helpers import side_by_side, torch_runner, train_tiny


def test_torch_archive_equals_load_policy_and_the_sidecar_names_every_tensor(tmp_path, capsys):
    run = train_tiny(tmp_path, "gtrxl")
    capsys.readouterr()
    assert main([f"checkpoint={run}", "format=torch", "value=true"]) == 0
    program = run / "checkpoints" / "last.pt2"  # out=null: beside the checkpoint
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["program"] == str(program) and summary["format"] == "torch"
    meta = json.loads((run / "checkpoints" / "last.pt2.json").read_text())
    assert meta["rltrans"] == __version__ and meta["program"] == "last.pt2"
    assert meta["agent"] == "gtrxl" and meta["batch_axis"] == 0 and meta["sample"] is False
    policy = load_policy(run, torch_threads=None)
    assert meta["observation_space"]["type"] == "Box" and meta["observation_space"]["shape"] == [2]
    rebuilt = [deserialize_space(json.dumps(meta[f"{k}_space"])) for k in ("observation", "action")]
    assert rebuilt == [policy.observation_space, policy.action_space]
    assert meta["action_space"] == {"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}
    inputs = {t["name"]: t for t in meta["inputs"]}
    outputs = {t["name"]: t for t in meta["outputs"]}
    assert list(inputs)[:2] == ["obs", "episode_start"] and list(outputs)[:3] == [
        "action", "logits", "value"]  # fmt: skip
    assert inputs["episode_start"]["dtype"] == "bool" and outputs["action"]["dtype"] == "int64"
    states = [t for t in meta["inputs"] if t["role"] == "state"]
    assert [t["name"] for t in states][:4] == [
        "state.keys", "state.values", "state.valid", "state.time"]  # fmt: skip
    assert {"state.long.S", "state.long.z"} <= set(inputs)  # gtrxl's default long memory
    for t in [*meta["inputs"], *meta["outputs"]]:
        assert t["shape"][0] == "batch" and t["doc"], t
    for t in states:  # each state input is replaced by an output of its shape and dtype
        twin = outputs[t["pairs"]]
        assert twin["pairs"] == t["name"] and twin["role"] == "state"
        assert (twin["shape"], twin["dtype"]) == (t["shape"], t["dtype"])
        assert t["initial"] == (False if t["dtype"] == "bool" else 0)
    envs = make_torch_env("stateless_cartpole", num_envs=3)
    layout = acting_program(policy)
    counts = side_by_side(program, policy, envs, 2, layout.state_tensors, runner=torch_runner)
    assert counts["staggered_resets"] >= 2, counts


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: checkpoint=<file or run dir> is required"),
        (["checkpoint=nowhere"], "error: no checkpoint at nowhere"),
        (["checkpoint=x", "format=tflite"], "format=tflite"),
    ],
)
def test_bad_command_lines_fail_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err, err


def test_every_knob_of_export_yaml_has_a_spec_and_valid_default():
    cfg = load_config([], "export")
    specs = config_specs(cfg, default_config("export", ()), "export")
    assert not [key for key, spec in specs.items() if spec is None]
    assert cfg.format == "onnx" and cfg.sample is False and cfg.value is False
