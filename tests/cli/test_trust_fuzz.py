"""Fuzzing the trust boundary: hostile configs in every file rltrans reads.

Random mutations of a real run's files (``_target_`` at random depths, interpolations, values
of other types, nesting, sizes far beyond any machine, env ids and wrapper paths naming code
in every spelling, YAML tags) go to ``rltrans.evaluate`` (a checkpoint), ``resume=true`` (a
run folder's config.yaml with its checkpoint) and ``train agent=dt dataset=...`` (a Minari
dataset's env spec). Every one must exit with code 2 naming what is wrong, import nothing
outside the trusted packages (a marker module proves it), write nothing outside the run
folder, and allocate nothing large (the peak resident set is bounded)."""

from __future__ import annotations

import json
import resource
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO
from tests.helpers.hostile import FUZZ, time_limit

MARKER = "rltrans_fuzz_marker"
PEAK_GROWTH_MB = 1024  # far below what any refused size would allocate

CODE_NAMES = [
    f"{MARKER}:Env-v0",
    f"{MARKER}.Wrap",
    f"{MARKER}:Wrap",
    "gymnasium.wrappers:RecordVideo",
    "gymnasium.wrappers.RecordVideo",
    "gymnasium.wrappers.HumanRendering",
]
HUGE = {"agent.dim": 10**8, "agent.layers": 10**6, "env.num_envs": 10**7, "agent.memory": 10**9}
INVALID_LEAVES = [
    "${oc.env:HOME}",
    "${nope.x}",
    {"_target_": f"{MARKER}.f"},
    float("nan"),
    float("inf"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A marker module, a finished CartPole PPO run and a Minari dataset, all made here."""
    root = tmp_path_factory.mktemp("fuzz")
    code = root / "code"
    code.mkdir()
    (code / f"{MARKER}.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('imported').write_text('yes')\n"
    )
    sys.path.insert(0, str(code))
    run = root / "run"
    args = ["env=gym", "env.id=CartPole-v1", *TINY_PPO, "total_steps=64", "tensorboard=false"]
    assert train_main([*args, f"run_dir={run}"]) == 0
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root / "minari"))
    collect = [
        "dataset_id=rltrans/fz-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "episodes=2",
        "max_episode_steps=20",
        "progress=false",
    ]
    assert collect_main(collect) == 0
    yield {"root": root, "run": run, "marker": code / "imported"}
    mp.undo()
    sys.path.remove(str(code))


def _paths(node, prefix=()):
    """Every path to a mapping in a config tree (for where to put a mutation)."""
    yield prefix
    if isinstance(node, dict):
        for name, value in node.items():
            if isinstance(value, dict) and name not in ("kwargs", "encoder"):
                yield from _paths(value, (*prefix, name))


def _at(tree, path):
    for part in path:
        tree = tree[part]
    return tree


@st.composite
def mutations(draw, config: dict):
    """1-3 hostile edits of a plain config dict, each sure to be refused."""
    out = json.loads(json.dumps(config))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["target", "leaf", "deep", "huge", "code", "unknown"]))
        mappings = list(_paths(out))
        where = _at(out, draw(st.sampled_from(mappings)))
        if kind == "target":
            where["_target_"] = draw(st.sampled_from(["builtins.open", f"{MARKER}.f"]))
        elif kind == "leaf":
            keys = [k for k, v in where.items() if not isinstance(v, dict)] or ["seed"]
            where[draw(st.sampled_from(keys))] = draw(st.sampled_from(INVALID_LEAVES))
        elif kind == "deep":
            bomb: dict = {"x": 1}
            for _ in range(draw(st.integers(13, 40))):
                bomb = {"x": bomb}
            where[draw(st.sampled_from(list(where) or ["seed"]))] = bomb
        elif kind == "huge":
            key = draw(st.sampled_from(sorted(HUGE)))
            section, name = key.split(".")
            out.setdefault(section, {})[name] = HUGE[key] * draw(st.sampled_from([1, 1000]))
        elif kind == "code":
            name = draw(st.sampled_from(CODE_NAMES))
            env = out["env"]
            if ":" in name and name.endswith("-v0"):
                env["id"] = name
            else:
                env["wrappers"] = [{"path": name, "kwargs": {"video_folder": "/tmp/fz-videos"}}]
        else:
            where[draw(st.sampled_from(["bogus", "nope_x", "layerz"]))] = 1
    return out


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _check_refused(code: int, err: str, world, before: set[str], folder: Path) -> None:
    assert code == 2, err
    assert err.startswith("error: "), err
    assert not world["marker"].exists(), "a module named by a file was imported"
    assert MARKER not in sys.modules
    new = {p for p in _snapshot(world["root"]) - before if not p.startswith(str(folder.name))}
    assert not new, f"written outside the run folder: {sorted(new)[:5]}"
    assert not Path("/tmp/fz-videos").exists()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _base_config(world) -> dict:
    return torch.load(world["run"] / "checkpoints" / "last.pt", weights_only=True)["config"]


def test_evaluate_refuses_every_hostile_checkpoint_config(world, capsys):
    base = _base_config(world)
    start = _peak_mb()

    @FUZZ
    @given(mutations(base))
    def check(config):
        folder = world["root"] / "ev"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "checkpoints").mkdir(parents=True)
        payload = torch.load(world["run"] / "checkpoints" / "last.pt", weights_only=True)
        payload["config"] = config
        torch.save(payload, folder / "checkpoints" / "last.pt")
        before = _snapshot(world["root"])
        with time_limit():
            code = evaluate_main([f"checkpoint={folder}", "episodes=1"])
        _check_refused(code, capsys.readouterr().err, world, before, folder)

    check()
    assert _peak_mb() - start < PEAK_GROWTH_MB


def test_resume_refuses_every_hostile_run_folder(world, capsys):
    base = _base_config(world)
    start = _peak_mb()

    @FUZZ
    @given(mutations(base), st.booleans(), st.booleans())
    def check(config, same_in_checkpoint, tag):
        folder = world["root"] / "rs"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(world["run"], folder)
        text = yaml.safe_dump(config)
        if tag:  # a YAML tag that would run code under an unsafe loader
            text += "extra: !!python/object/apply:os.system ['touch /tmp/fz-tagged']\n"
        (folder / "config.yaml").write_text(text)
        if same_in_checkpoint:
            path = folder / "checkpoints" / "last.pt"
            payload = torch.load(path, weights_only=True)
            payload["config"] = config
            torch.save(payload, path)
        before = _snapshot(world["root"])
        with time_limit():
            code = train_main(["resume=true", f"run_dir={folder}", "total_steps=128"])
        _check_refused(code, capsys.readouterr().err, world, before, folder)
        assert not Path("/tmp/fz-tagged").exists()

    check()
    assert _peak_mb() - start < PEAK_GROWTH_MB


SPEC_EDITS = st.sampled_from(
    [
        {"id": f"{MARKER}:Env-v0"},
        {"additional_wrappers": [{"name": "w", "entry_point": f"{MARKER}:Wrap", "kwargs": {}}]},
        {"additional_wrappers": [{"name": "w", "entry_point": f"{MARKER}.Wrap", "kwargs": {}}]},
        {
            "additional_wrappers": [
                {
                    "name": "RecordVideo",
                    "entry_point": "gymnasium.wrappers:RecordVideo",
                    "kwargs": {"video_folder": "/tmp/fz-videos"},
                }
            ]
        },
        {"kwargs": {"_target_": "builtins.open"}},
        {"kwargs": {"x": "${oc.env:HOME}"}},
        {"kwargs": {"x": {"_target_": f"{MARKER}.f"}}},
    ]
)


def test_offline_training_refuses_every_hostile_dataset_env_spec(world, capsys):
    meta_path = world["root"] / "minari" / "rltrans" / "fz-v0" / "data" / "metadata.json"
    original = meta_path.read_text()
    start = _peak_mb()
    args = ["agent=dt", "dataset=rltrans/fz-v0", "train_steps=2", "agent.dim=16"]
    args += ["agent.layers=1", "algo.eval_episodes=1", "algo.eval_num_targets=1", "progress=false"]

    @FUZZ
    @given(st.lists(SPEC_EDITS, min_size=1, max_size=3))
    def check(edits):
        meta = json.loads(original)
        spec = json.loads(meta["eval_env_spec"])
        for edit in edits:
            spec.update(edit)
        meta["eval_env_spec"] = json.dumps(spec)
        meta_path.write_text(json.dumps(meta))
        folder = world["root"] / "dt"
        before = _snapshot(world["root"])
        with time_limit():
            code = train_main([*args, f"run_dir={folder}"])
        _check_refused(code, capsys.readouterr().err, world, before, folder)
        assert not folder.exists()

    try:
        check()
    finally:
        meta_path.write_text(original)
    assert _peak_mb() - start < PEAK_GROWTH_MB
