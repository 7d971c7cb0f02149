"""The trust boundary: every file rltrans reads (a checkpoint's config, a run folder's
config.yaml, a Minari dataset's env spec) is checked like a command line before anything is
built or imported, and a run folder is written without following links.

Each test reproduces a way the files used to get past the command line's checks. A marker
module on sys.path records its own import, so a test proves that nothing named by a file was
imported."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rltrans import load_policy
from rltrans.collect import main as collect_main
from rltrans.config import ConfigError, load_config
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import CheckpointError
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line

MARKER = "rltrans_marker_mod"


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    """A module on sys.path that writes ``imported`` next to itself when imported, and
    defines a Wrapper subclass and an env id registration."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / f"{MARKER}.py").write_text(
        "from pathlib import Path\n"
        "import gymnasium as gym\n"
        "Path(__file__).with_name('imported').write_text('yes')\n"
        "class Wrap(gym.Wrapper):\n"
        "    pass\n"
        "gym.register('Marked-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=40)\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, MARKER, raising=False)
    yield folder / "imported"
    sys.modules.pop(MARKER, None)


def error_text(capsys) -> str:
    """What a refused command printed on stderr (checked to be the error form)."""
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    return err


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """A tiny finished PPO run on CartPole (a kind gym env)."""
    run = tmp_path_factory.mktemp("cartpole") / "run"
    args = ["env=gym", "env.id=CartPole-v1", *TINY_PPO, "total_steps=64", "tensorboard=false"]
    assert train_main([*args, f"run_dir={run}"]) == 0
    return run


def copy_run(run: Path, target: Path) -> Path:
    """A copy of a run folder (config.yaml and last.pt only)."""
    (target / "checkpoints").mkdir(parents=True)
    (target / "config.yaml").write_bytes((run / "config.yaml").read_bytes())
    last = run / "checkpoints" / "last.pt"
    (target / "checkpoints" / "last.pt").write_bytes(last.read_bytes())
    return target


def edit_checkpoint(path: Path, edit) -> Path:
    """Rewrite a checkpoint as an attacker would (plain torch.save), ``edit(payload)``."""
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, path)
    return path


def edit_both(run: Path, edit) -> None:
    """Apply ``edit(config dict)`` to a run's config.yaml and to its checkpoint's config."""
    data = yaml.safe_load((run / "config.yaml").read_text())
    edit(data)
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    edit_checkpoint(run / "checkpoints" / "last.pt", lambda p: edit(p["config"]))


@pytest.fixture
def dataset(tmp_path, monkeypatch, capsys) -> Path:
    """A small CartPole Minari dataset written by rltrans.collect; returns its folder."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    args = [
        "dataset_id=rltrans/cp-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "episodes=4",
        "num_envs=2",
        "max_episode_steps=30",
        "progress=false",
    ]
    assert collect_main(args) == 0
    capsys.readouterr()
    return tmp_path / "minari" / "rltrans" / "cp-v0"


def edit_eval_spec(folder: Path, **changes) -> None:
    """Change the evaluation env spec in a Minari dataset's metadata.json."""
    path = folder / "data" / "metadata.json"
    meta = json.loads(path.read_text())
    spec = json.loads(meta["eval_env_spec"])
    spec.update(changes)
    meta["eval_env_spec"] = json.dumps(spec)
    path.write_text(json.dumps(meta))


DT_TINY = [
    "agent=dt",
    "dataset=rltrans/cp-v0",
    "train_steps=4",
    "agent.dim=16",
    "agent.layers=1",
    "agent.context=4",
    "algo.batch_size=4",
    "algo.eval_episodes=1",
    "algo.eval_num_targets=1",
    "progress=false",
]


# ----------------------------------------------------------------------------- 1. datasets


@pytest.mark.parametrize(
    "spec",
    [
        {"additional_wrappers": [{"name": "x", "entry_point": "this:s", "kwargs": {}}]},
        {"additional_wrappers": [{"name": "x", "entry_point": f"{MARKER}:Wrap", "kwargs": {}}]},
        {"id": f"{MARKER}:Marked-v0"},
        {
            "additional_wrappers": [
                {
                    "name": "RecordVideo",
                    "entry_point": "gymnasium.wrappers:RecordVideo",
                    "kwargs": {"video_folder": "somewhere"},
                }
            ]
        },
    ],
)
def test_a_datasets_env_spec_names_no_code_without_trust(
    spec, dataset, marker, tmp_path, capsys, monkeypatch
):
    monkeypatch.delitem(sys.modules, "this", raising=False)  # an import would show again
    edit_eval_spec(dataset, **spec)
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}"]) == 2
    err = error_text(capsys)
    assert "dataset 'rltrans/cp-v0'" in err and "trust_env_code=true" in err
    assert "The Zen of Python" not in capsys.readouterr().out
    assert "this" not in sys.modules
    assert not marker.exists(), "the dataset's module was imported"
    assert not run.exists() and not (tmp_path / "somewhere").exists()


def test_a_trusted_datasets_env_module_is_imported(dataset, marker, tmp_path, capsys):
    edit_eval_spec(
        dataset,
        additional_wrappers=[{"name": "x", "entry_point": f"{MARKER}:Wrap", "kwargs": {}}],
    )
    run = tmp_path / "run"
    assert train_main([*DT_TINY, f"run_dir={run}", "trust_env_code=true"]) == 0, capsys
    assert marker.exists()


# ----------------------------------------------------------------------------- 2. resume


def test_resume_imports_no_module_named_by_the_run_folder(cartpole_run, marker, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    edit_both(run, lambda c: c["env"].update(id=f"{MARKER}:Marked-v0"))
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    err = error_text(capsys)
    assert "config.yaml names code to import" in err and "env.id: module" in err
    assert not marker.exists()
    # trusted: the module is imported (its id registers an env with CartPole's spaces)
    args = ["resume=true", f"run_dir={run}", "total_steps=128", "trust_env_code=true"]
    assert train_main(args) == 0
    assert marker.exists()


def test_train_takes_trust_env_code():
    assert load_config(["trust_env_code=true"]).trust_env_code is True


# ----------------------------------------------------------------------------- 3. links


@pytest.mark.parametrize(
    ("entry", "resume"),
    [
        (".lock", False),
        (".lock", True),
        ("config.yaml", False),
        ("config.yaml.tmp", False),
        ("config.yaml.tmp", True),
        ("checkpoints", False),
    ],
)
def test_run_folder_writes_never_follow_links(entry, resume, cartpole_run, tmp_path, capsys):
    victim = tmp_path / "victim"
    if entry == "checkpoints":
        victim.mkdir()
    else:
        victim.write_text("keep")
    if resume:
        run = copy_run(cartpole_run, tmp_path / "run")
        args = ["resume=true", f"run_dir={run}", "total_steps=128"]
    else:
        run = tmp_path / "run"
        run.mkdir()
        args = [*TINY_PPO, "total_steps=64", f"run_dir={run}"]
    (run / entry).symlink_to(victim)
    code = train_main(args)
    if entry == "config.yaml.tmp":
        assert code == 0  # the temp file has a unique name: the link is never opened
    else:
        assert code == 2
        assert "link" in error_text(capsys)
    if entry == "checkpoints":
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "keep"


# ----------------------------------------------------------------------------- 4. wrappers


@pytest.mark.parametrize(
    "path", ["gymnasium.wrappers:RecordVideo", "gymnasium.wrappers.RecordVideo"]
)
def test_side_effect_wrappers_are_refused_in_either_spelling(path, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    where = tmp_path / "elsewhere"
    wrapper = {"path": path, "kwargs": {"video_folder": str(where)}}

    def edit(payload):
        payload["config"]["env"]["wrappers"] = [wrapper]
        payload["config"]["env"]["kwargs"] = {"render_mode": "rgb_array"}

    edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    assert evaluate_main([f"checkpoint={run}", "episodes=1"]) == 2
    assert "writes files" in error_text(capsys)
    assert not where.exists()


def test_env_code_reads_both_wrapper_spellings():
    from rltrans.config import env_code

    env = {"kind": "gym", "id": "CartPole-v1"}
    for path in ("my_pkg:Wrap", "my_pkg.Wrap", "gymnasium.wrappers.record_video:RecordVideo"):
        assert env_code({**env, "wrappers": [{"path": path}]}), path
    for path in ("gymnasium.wrappers:TimeAwareObservation", "gymnasium.wrappers.ClipReward"):
        assert env_code({**env, "wrappers": [{"path": path}]}) == [], path


# ----------------------------------------------------------------------------- 5. saved configs


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c["algo"].update(gamma=1.5), "algo.gamma=1.5: expected a number in (0, 1]"),
        (lambda c: c["algo"].update(bogus=1), "unknown config key 'algo.bogus'"),
        (lambda c: c["algo"].update(lr=float("nan")), "algo.lr"),
        (lambda c: c["algo"].update(lr="${oc.env:HOME}"), "interpolations are not resolved"),
        (lambda c: c["algo"].update(lr="${nope.x}"), "interpolations are not resolved"),
        (lambda c: c["agent"].update(_target_="builtins.open"), "agent._target_"),
        (lambda c: c["env"].update(_target_="builtins.open"), "env._target_"),
        (lambda c: c.update(_target_="builtins.open"), "_target_="),
        (lambda c: c["agent"].update(dim=-5), "agent.dim=-5"),
        (lambda c: c.update(agent=[1, 2]), "agent=[1, 2]: expected a mapping"),
    ],
)
def test_a_resumed_run_checks_its_saved_config(edit, expected, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    edit_both(run, edit)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    err = error_text(capsys)
    assert expected in err and "config.yaml" in err, err
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert os.environ.get("HOME", "/nonexistent") not in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the config is empty"),
        ("[1, 2", "not valid YAML"),
        ("seed: !!python/object/apply:os.system ['true']", "not valid YAML"),
        ("- a\n- b\n", "a list, not a mapping"),
    ],
)
def test_a_broken_config_yaml_is_one_error_line(text, expected, cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")
    (run / "config.yaml").write_text(text)
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    assert expected in error_text(capsys)


def test_resume_refuses_a_config_yaml_edited_apart_from_its_checkpoint(
    cartpole_run, tmp_path, capsys
):
    run = copy_run(cartpole_run, tmp_path / "run")
    original = (run / "config.yaml").read_text()
    gamma = yaml.safe_load(original)["algo"]["gamma"]
    text = original.replace(f"gamma: {gamma}\n", "gamma: 0.5\n")
    (run / "config.yaml").write_text(text)
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 2
    err = error_text(capsys)
    assert f"algo.gamma: config.yaml 0.5, checkpoint {gamma}" in err
    # budget keys may differ (a resume with a new total_steps writes them)
    (run / "config.yaml").write_text(original)
    edit_both(run, lambda c: c.update(total_steps=96))
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=128"]) == 0
    assert summary_line(capsys.readouterr().out)["global_step"] == 128


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p["config"]["agent"].update(dim=10**8),
        lambda p: p["config"]["agent"].update(layers=10**6),
        lambda p: p["config"]["env"].update(num_envs=10**7),
        lambda p: p["config"]["agent"].update(dim=-5),
        lambda p: p.update(config="a string"),
        lambda p: p["config"].update(agent=[1]),
        lambda p: p["config"]["agent"].update(kind="memory", _target_="builtins.open"),
        lambda p: p.update(_target_="builtins.open"),
        lambda p: p.update(observation_space='{"type": "Box", "shape": [3]}'),
        lambda p: p["model"].update(extra=torch.zeros(1)),
        lambda p: p.update(agent_kwargs={"stats": {"max_timestep": 10**12}}),
    ],
)
def test_a_checkpoint_config_is_checked_before_anything_is_allocated(
    edit, cartpole_run, tmp_path, capsys
):
    run = copy_run(cartpole_run, tmp_path / "run")
    path = edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    with pytest.raises((CheckpointError, ConfigError)) as caught:
        load_policy(path)
    assert str(path) in str(caught.value) or "checkpoint" in str(caught.value)
    assert evaluate_main([f"checkpoint={path}", "episodes=1"]) == 2
    error_text(capsys)


def test_older_checkpoints_lacking_new_keys_still_load(cartpole_run, tmp_path, capsys):
    run = copy_run(cartpole_run, tmp_path / "run")

    def drop(payload):
        for key in ("keep_checkpoints", "compile"):
            payload["config"].pop(key)
        payload["config"]["algo"].pop("vf_clip_coef")

    edit_checkpoint(run / "checkpoints" / "last.pt", drop)
    assert evaluate_main([f"checkpoint={run}", "episodes=1", "num_envs=1"]) == 0


def test_a_file_config_gets_every_problem_with_its_source():
    from rltrans.config import checked_file_config

    cfg = {"algo": {"kind": "online", "gamma": 2}, "agent": {"kind": "memory", "dim": "x"}}
    with pytest.raises(ConfigError) as caught:
        checked_file_config(cfg, "somefile")
    lines = str(caught.value).splitlines()
    assert all(line.strip().startswith("somefile: ") for line in lines[1:])
    assert any("algo.gamma=2" in line for line in lines) and any(
        "agent.dim=x" in ln for ln in lines
    )


# ----------------------------------------------------------------------------- 6. bad values


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["algo.num_minibatches=1000"], "algo.num_minibatches=1000: more than the 8 segments"),
        (["env.num_envs=1e30"], "env.num_envs=1e+30: expected an integer in [1, 2^20]"),
        (["env.num_envs=2000000"], "env.num_envs=2000000: expected an integer in [1, 2^20]"),
        (["total_steps=1e30"], "total_steps=1e+30: expected an integer in [1, 10^15]"),
        (["run_dir="], "run_dir='': expected null or a non-empty string"),
    ],
)
def test_bad_values_stop_before_any_folder_is_written(
    args, expected, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    extra = [] if any(a.startswith("run_dir=") for a in args) else [f"run_dir={tmp_path}/run"]
    tiny = [a for a in TINY_PPO if not a.startswith("algo.num_minibatches")]
    assert train_main([*tiny, *extra, *args]) == 2
    assert expected in error_text(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_memory_estimate_refuses_a_run_larger_than_the_machine(tmp_path, capsys, monkeypatch):
    from rltrans.config import resources

    monkeypatch.setattr(resources, "physical_memory", lambda: 24 * 2**30)
    args = ["env.num_envs=100000", "total_steps=12800000", f"run_dir={tmp_path}/run"]
    assert train_main(args) == 2
    err = error_text(capsys)
    assert "needs at least" in err and "24.0 GiB" in err and "env.num_envs" in err
    assert not (tmp_path / "run").exists()
    assert load_config(["env.num_envs=1024"]).env.num_envs == 1024  # a large real run passes


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["num_envs=1e8"], "expected null or an integer in [1, 2^20]"),
        (["episodes=1e9"], "expected an integer in [1, 10^7]"),
    ],
)
def test_evaluate_refuses_sizes_before_building(args, expected, cartpole_run, capsys):
    assert evaluate_main([f"checkpoint={cartpole_run}", *args]) == 2
    assert expected in error_text(capsys)


def test_run_dir_naming_a_file_or_an_uncreatable_folder_is_one_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert train_main([*TINY_PPO, f"run_dir={afile}"]) == 2
    assert "is a file, not a folder" in error_text(capsys)
    assert afile.read_text() == "keep"
    assert train_main([*TINY_PPO, f"run_dir={afile}/sub"]) == 2
    assert "cannot create it" in error_text(capsys)


# ----------------------------------------------------------------------------- 7. the lock


def test_a_process_that_loses_the_lock_removes_nothing(tmp_path, capsys, monkeypatch):
    """The race: this process creates the folder, another takes the lock before it does."""
    from rltrans.run import context as run_module

    folder = tmp_path / "run"
    real_acquire = run_module.RunFolderLock.acquire
    holder: list[int] = []

    def winner_first(self):
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the winner's lock
        (folder / "winner.txt").write_text("running")
        holder.append(fd)
        return real_acquire(self)

    monkeypatch.setattr(run_module.RunFolderLock, "acquire", winner_first)
    assert train_main([*TINY_PPO, f"run_dir={folder}"]) == 2
    assert "in use" in error_text(capsys)
    assert (folder / "winner.txt").read_text() == "running"
    os.close(holder[0])
