"""Fuzzing every input rltrans reads, beyond the configs: every field of PPO and DT
checkpoints (weights, optimizer, RNG, counters, offline fields), a Minari dataset's metadata,
``rltrans.plot``'s run folders and options, and the command lines of train, evaluate and collect.

Each generated input must either pass (exit 0) or be refused with exit code 2 and one
``error:`` line; no exception may escape (a traceback fails the test), no example may run
longer than :data:`EXAMPLE_SECONDS` (a hang fails it), the peak resident set may not grow by
:data:`PEAK_GROWTH_MB`, and nothing may be written outside the example's own folder."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.plot import main as plot_main
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO
from tests.helpers.hostile import FUZZ, PEAK_GROWTH_MB, peak_mb, snapshot, time_limit

# Plain values of every kind a file can hold, the odd ones included.
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, 2**20, 2**26, 2**31, 2**63, 10**9])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["???", "${oc.env:HOME}", "abc", "", "\x00", "1e400", "nan"])
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def nested(depth: int) -> dict:
    """A mapping nested ``depth`` levels deep."""
    node: dict = {"x": 1}
    for _ in range(depth):
        node = {"x": node}
    return node


class Deep:
    """A mapping ``depth`` levels deep, made fresh where it is used (hypothesis reports an
    example by printing it, which a 700-deep tree would overflow)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def __repr__(self) -> str:
        return f"Deep({self.depth})"


def real(value):
    """``value`` with every Deep made into its tree."""
    if isinstance(value, Deep):
        return nested(value.depth)
    if isinstance(value, dict):
        return {k: real(v) for k, v in value.items()}
    if isinstance(value, list):
        return [real(v) for v in value]
    return value


HOSTILE = VALUES | st.builds(Deep, st.sampled_from([40, 700]))


def check_answer(code: int, err: str) -> None:
    """Passed, or refused with one error line; never anything else."""
    assert code in (0, 2), err
    if code == 2:  # notices (a rounded budget, the compile choice) may come before it
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, err
    assert "Traceback" not in err, err


def only_inside(root: Path, before: set[str], *folders: str) -> None:
    """Nothing new under ``root`` outside ``folders`` (paths relative to root)."""
    new = {p for p in snapshot(root) - before if not p.startswith(folders)}
    assert not new, f"written outside the example's folder: {sorted(new)[:5]}"


def save_deep(payload: dict, path: Path) -> None:
    """torch.save that follows deep trees (pickling recurses once per level)."""
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        torch.save(payload, path)
    finally:
        sys.setrecursionlimit(limit)


# ----------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished PPO run on CartPole (with TensorBoard events), a Minari dataset and a
    finished DT run on it, all made here."""
    root = tmp_path_factory.mktemp("hostile")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root / "minari"))
    ppo = root / "ppo"
    args = ["env=gym", "env.id=CartPole-v1", *TINY_PPO, "total_steps=128", "checkpoint_every=1"]
    assert train_main([*args, f"run_dir={ppo}"]) == 0
    collect = [
        "dataset_id=rltrans/hf-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "episodes=4",
        "num_envs=2",
        "max_episode_steps=20",
        "progress=false",
    ]
    assert collect_main(collect) == 0
    impala = root / "impala"
    args = ["algo=impala", "runtime=local", "env=gym", "env.id=CartPole-v1", "env.num_envs=4"]
    args += ["algo.num_steps=16", "agent.dim=16", "agent.layers=1", "agent.heads=2"]
    args += ["agent.memory=8", "total_steps=128", "progress=false", "tensorboard=false"]
    assert train_main([*args, f"run_dir={impala}"]) == 0
    dt_args = ["dataset=rltrans/hf-v0", "train_steps=2", "agent.dim=16", "agent.layers=1"]
    dt_args += ["algo.batch_size=4", "progress=false", "algo.eval_episodes=1"]
    dt_args += ["algo.eval_num_targets=1", "tensorboard=false", "algo.eval_max_steps=500"]
    dt_args = ["agent=dt", "agent.context=4", *dt_args]
    assert train_main([*dt_args, f"run_dir={root / 'dt'}"]) == 0
    bc_args = ["agent=bc", "agent.history=4", *dt_args[2:]]
    assert train_main([*bc_args, f"run_dir={root / 'bc'}"]) == 0
    yield {
        "root": root,
        **{kind: root / kind for kind in ("ppo", "impala", "dt", "bc")},
        "dt_args": dt_args,
    }
    mp.undo()


def fresh_copy(run: Path, folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(run, folder, symlinks=True)
    return folder


# ----------------------------------------------------------------------------- checkpoints


@st.composite
def payload_edits(draw, payload: dict) -> list[tuple[tuple, object]]:
    """1-3 (path, value) edits of a checkpoint payload: any field at any depth of the plain
    parts, a weight tensor replaced (NaN, another shape or dtype), or a new top-level key."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "deep", "weight", "new"]))
        if kind == "weight":
            name = draw(st.sampled_from(sorted(payload["model"])))
            value = draw(
                st.sampled_from(
                    [
                        torch.full((2,), math.nan),
                        torch.full((3, 3), math.inf),
                        torch.zeros(1, dtype=torch.int64),
                        "not a tensor",
                    ]
                )
            )
            edits.append((("model", name), value))
            continue
        if kind == "new":
            edits.append(((draw(st.text(min_size=1, max_size=8)),), draw(VALUES)))
            continue
        path: tuple = (draw(st.sampled_from(sorted(k for k in payload if k != "model"))),)
        node = payload[path[0]]
        while kind == "deep" and isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node, key=str)))
            path, node = (*path, key), node[key]
        edits.append((path, draw(HOSTILE)))
    return edits


def apply_edits(payload: dict, edits: list) -> dict:
    for path, value in edits:
        node = payload
        for key in path[:-1]:  # an earlier edit may have replaced a node on the way
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = real(value)
    return payload


@pytest.mark.parametrize("kind", ["ppo", "impala", "dt", "bc"])
def test_every_checkpoint_field_passes_or_is_refused(kind, world, capsys):
    run = world[kind]
    original = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    start = peak_mb()

    @FUZZ
    @given(payload_edits(original), st.sampled_from(["evaluate", "resume"]))
    def check(edits, command):
        folder = fresh_copy(run, world["root"] / f"ck-{kind}")
        payload = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
        save_deep(apply_edits(payload, edits), folder / "checkpoints" / "last.pt")
        before = snapshot(world["root"])
        with time_limit():
            if command == "evaluate":
                code = evaluate_main([f"checkpoint={folder}", "episodes=1", "max_steps=200"])
            else:
                # the budget the run already reached: everything loads, nothing trains
                budget = "train_steps=2" if kind in ("dt", "bc") else "total_steps=128"
                code = train_main(["resume=true", f"run_dir={folder}", budget])
        check_answer(code, capsys.readouterr().err)
        only_inside(world["root"], before, folder.name)

    check()
    assert peak_mb() - start < PEAK_GROWTH_MB


# ----------------------------------------------------------------------------- datasets


@st.composite
def metadata_edits(draw, meta: dict) -> dict:
    """A Minari metadata.json with 1-3 hostile edits: a top-level field or a field of the
    evaluation env spec (its kwargs and wrappers included)."""
    meta = json.loads(json.dumps(meta))
    spec = json.loads(meta["eval_env_spec"])
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["meta", "spec", "kwargs", "wrapper"]))
        value = draw(HOSTILE)
        if where == "meta":
            meta[draw(st.sampled_from(sorted(meta)))] = value
        elif where == "spec":
            spec[draw(st.sampled_from(sorted(spec)))] = value
        elif where == "kwargs":
            # an earlier edit may have made the kwargs themselves hostile: edit fresh ones then
            if not isinstance(spec.get("kwargs"), dict):
                spec["kwargs"] = {}
            spec["kwargs"][draw(st.sampled_from(["x", "max_episode_steps"]))] = value
        else:
            name = draw(st.sampled_from(["FrameStackObservation", "TimeLimit", "ClipReward"]))
            arg = draw(st.sampled_from(["stack_size", "max_episode_steps", "min_reward"]))
            entry = f"gymnasium.wrappers:{name}"
            spec["additional_wrappers"] = [
                {"name": name, "entry_point": entry, "kwargs": {arg: value}}
            ]
    if draw(st.booleans()):
        meta["eval_env_spec"] = json.dumps(real(spec))
    return meta


def test_every_dataset_metadata_passes_or_is_refused(world, capsys):
    meta_path = world["root"] / "minari" / "rltrans" / "hf-v0" / "data" / "metadata.json"
    original = meta_path.read_text()
    start = peak_mb()

    @FUZZ
    @given(metadata_edits(json.loads(original)))
    def check(meta):
        meta_path.write_text(json.dumps(real(meta)))
        folder = world["root"] / "ds-run"
        shutil.rmtree(folder, ignore_errors=True)
        before = snapshot(world["root"])
        with time_limit():
            code = train_main([*world["dt_args"], f"run_dir={folder}"])
        check_answer(code, capsys.readouterr().err)
        only_inside(world["root"], before, folder.name)
        if code == 2:
            assert not folder.exists(), "a refused run left its folder"

    try:
        check()
    finally:
        meta_path.write_text(original)
    assert peak_mb() - start < PEAK_GROWTH_MB


# ----------------------------------------------------------------------------- plot


@st.composite
def plot_inputs(draw) -> dict:
    """A hostile edit of a run folder for rltrans.plot, and its options."""
    edit = draw(st.sampled_from(["config", "yaml", "events", "truncate", "options", "deep"]))
    out: dict = {"edit": edit, "options": []}
    if edit == "config":
        out["text"] = yaml.safe_dump(draw(VALUES))
    elif edit == "yaml":
        out["text"] = draw(st.text(max_size=200))
    elif edit == "deep":
        out["text"] = "seed: " + "[" * 3000 + "]" * 3000
    elif edit == "events":
        out["bytes"] = draw(st.binary(max_size=400))
    elif edit == "truncate":
        out["keep"] = draw(st.integers(0, 2000))
    else:
        key = draw(st.sampled_from(["tag", "x", "out", "csv"]))
        value = draw(st.text(max_size=20).filter(lambda s: "/" not in s and "\x00" not in s))
        out["options"] = [f"{key}={value}"]
    return out


def test_every_plot_input_passes_or_is_refused(world, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    start = peak_mb()

    @FUZZ
    @given(plot_inputs())
    def check(case):
        folder = world["root"] / "pl"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        run = fresh_copy(world["ppo"], folder / "run")
        event = next((run / "tb").iterdir())
        if "text" in case:
            (run / "config.yaml").write_text(case["text"])
        elif "bytes" in case:
            event.write_bytes(case["bytes"])
        elif "keep" in case:
            event.write_bytes(event.read_bytes()[: case["keep"]])
        monkeypatch.chdir(folder)  # out= and csv= are written relative to here
        before = snapshot(world["root"])
        with time_limit():
            code = plot_main([str(run), *case["options"]])
        check_answer(code, capsys.readouterr().err)
        only_inside(world["root"], before, "pl")

    check()
    assert peak_mb() - start < PEAK_GROWTH_MB


# ----------------------------------------------------------------------------- command lines

BAD_TEXT = ["nan", "inf", "-inf", "???", "abc", "'${oc.env:HOME}'", "[1,2]", "{a: 1}", "1e400"]
BAD_TEXT += ["99999999999999999999999", "-1", "''", "1.5"]  # null: a valid default of several
TRAIN_KEYS = [
    "agent.dim", "agent.layers", "agent.heads", "agent.memory", "env.num_envs",
    "algo.num_steps", "algo.segment_length", "algo.num_minibatches", "algo.epochs",
    "seed", "torch_threads", "total_steps",
]  # fmt: skip
HORIZON_FITS = {"agent.memory", "algo.num_steps", "algo.segment_length"}
# Sizes each valid alone that no machine holds together (or that no process should spawn).
TOO_BIG = [
    ["agent.dim=65536", "agent.layers=1024"],
    ["env.num_envs=1048576", "agent.memory=1048576"],
    ["agent.horizon=1048576"],
    ["torch_threads=100000"],
    ["algo=impala", "runtime.num_actors=4096"],
    ["agent.position=learned", "agent.max_len=1048576", "agent.dim=65536"],
]


@st.composite
def train_lines(draw) -> list[str]:
    if draw(st.booleans()):
        return draw(st.sampled_from(TOO_BIG))
    keys = draw(st.lists(st.sampled_from(TRAIN_KEYS), min_size=1, max_size=3, unique=True))
    return [f"{key}={draw(st.sampled_from(BAD_TEXT))}" for key in keys]


def test_every_hostile_command_line_is_refused(world, capsys):
    start = peak_mb()

    @FUZZ
    @given(train_lines())
    def check(line):
        folder = world["root"] / "cl"
        shutil.rmtree(folder, ignore_errors=True)
        before = snapshot(world["root"])
        base = TINY_PPO
        if any(arg.startswith("agent.horizon=") for arg in line):  # the fit sizes these, and
            base = [a for a in TINY_PPO if a.split("=")[0] not in HORIZON_FITS]  # keeps given ones
        with time_limit():
            code = train_main([*base, "tensorboard=false", *line, f"run_dir={folder}"])
        err = capsys.readouterr().err
        assert code == 2, (line, err)
        check_answer(code, err)
        assert not folder.exists(), "a refused run left its folder"
        only_inside(world["root"], before, "cl")

    check()
    assert peak_mb() - start < PEAK_GROWTH_MB


EVALUATE_KEYS = ["episodes", "num_envs", "max_steps", "seed", "torch_threads", "target_return"]


@given(
    st.lists(st.sampled_from(EVALUATE_KEYS), min_size=1, max_size=3, unique=True),
    st.data(),
)
@FUZZ
def test_every_hostile_evaluate_or_collect_line_is_refused(world, capsys, keys, data):
    command = data.draw(st.sampled_from(["evaluate", "collect"]))
    line = [f"{k}={data.draw(st.sampled_from(BAD_TEXT))}" for k in keys]
    before = snapshot(world["root"])
    with time_limit():
        if command == "evaluate":
            code = evaluate_main([f"checkpoint={world['ppo']}", *line])
        else:
            line = [item for item in line if not item.startswith(("num_envs", "max_steps"))]
            args = [f"policy={world['ppo']}", "dataset_id=rltrans/cl-v0", "progress=false"]
            code = collect_main([*args, *(line or ["episodes=-1"])])
    err = capsys.readouterr().err
    assert code == 2, (command, line, err)
    check_answer(code, err)
    only_inside(world["root"], before, "nothing")
