"""Fuzzing the trainer state a checkpoint saves besides its weights and config: thread
choices, optimizer groups and moments, the learning-rate schedule, reward-scaler statistics,
counters, the episode window and the RNG states of PPO, IMPALA and offline (DT) runs.

Each example edits one or two saved values (a tensor filled with NaN, inf or negatives,
reshaped or retyped; a value replaced by a hostile one; a key deleted) and resumes the run for
one more update, so a value that loads is also used. Where :data:`rltrans.run.saved_state.FIELDS`
refuses the edited state, the resume must be refused with exactly that one ``error:`` line
naming the checkpoint, before anything is written. Where it accepts it, the resume trains
(exit 0), stops with the run's own non-finite-loss message (exit 1: a finite hyperparameter
in range, such as an lr of 10^30, may diverge as it would from the config) or is refused by
a later check with one line (exit 2); never a traceback, a crash or a hang. A last test
checks that every value these trainers save is some FIELDS entry's."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rltrans.collect import main as collect_main
from rltrans.run.saved_state import FIELDS, saved_state_problem
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO
from tests.helpers.hostile import FUZZ, PEAK_GROWTH_MB, peak_mb, snapshot, time_limit

# Payload entries that are not trainer state (checked where they are read: the config, the
# spaces and the offline fields by rltrans.policy, the weights by check_finite_weights).
NOT_STATE = {
    "model", "config", "observation_space", "action_space", "observation_space_json",
    "action_space_json", "format_version", "rltrans_version", "agent_kwargs", "dataset",
    "eval_targets", "eval_env",
}  # fmt: skip
SCALARS = (
    st.sampled_from(
        [
            *(math.nan, math.inf, -math.inf, -1, -0.5, 0, 1, 2, 7, 624, 625, 1024, 1025),
            *(2**31, 2**32, 2**53, 2**62, 2**64, 10**15, -(2**63), 1e-300, 1e30, 0.999, 1.5),
            *("abc", "", "nan", "compiled", "MT19937", None, True, False, [], {}, [1], (0.9,)),
            *({"chosen": 1}, {"a": 1}, (0.9, 0.999), (1.0, 0.5), "{not json", 1.0),
        ]
    )
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
)
# Finite moments of 10^30 pass every check and blow the weights up in one step, which the
# run's non-finite-loss stop does not see when no loss follows (a DT's last step, then its
# evaluation): they are values a field check cannot bound, not drawn here.
MOMENTS = ("learner", "optimizer", "state")
TENSOR_EDITS = [
    "nan", "inf", "negative", "huge", "random bytes", "3 values", "one more axis", "0-d",
    "int64", "bool", "float16", "complex64", "not a tensor",
]  # fmt: skip


def _edit_tensor(t: torch.Tensor, how: str):
    """``t`` damaged as ``how`` says."""
    float_like = t.is_floating_point()
    base = t.clone() if float_like else t.double()
    edits = {
        "nan": lambda: base.fill_(math.nan),
        "inf": lambda: base.fill_(math.inf),
        "negative": lambda: base.fill_(-1.0) if float_like else t.clone().fill_(-1),
        "huge": lambda: base.fill_(1e30) if float_like else t.clone().fill_(2**62),
        "random bytes": lambda: torch.randint(0, 256, t.shape, dtype=torch.uint8),
        "3 values": lambda: torch.zeros(3, dtype=t.dtype),
        "one more axis": lambda: t.clone().unsqueeze(0),
        "0-d": lambda: t.flatten()[:1].clone().reshape(()),
        "int64": lambda: t.to(torch.int64),
        "bool": lambda: t.to(torch.bool),
        "float16": lambda: t.to(torch.float16),
        "complex64": lambda: t.to(torch.complex64),
        "not a tensor": lambda: t.tolist() if t.numel() < 8 else "tensor",
    }
    if t.numel() == 0 and how == "0-d":
        return t
    return edits[how]()


# ----------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Finished runs whose checkpoints hold every kind of trainer state: PPO with thread
    tuners and a reward scaler, IMPALA (RMSprop with momentum) with per-actor scalers, and
    DT with its window sampler, on CartPole and a dataset collected here."""
    root = tmp_path_factory.mktemp("state-fuzz")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root / "minari"))
    quiet = ["tensorboard=false", "compile=false", "torch_threads=auto", "progress=false"]
    ppo = ["env=gym", "env.id=CartPole-v1", *TINY_PPO, "total_steps=128", *quiet]
    assert train_main([*ppo, f"run_dir={root / 'ppo'}"]) == 0
    impala = ["algo=impala", "runtime=local", "env=gym", "env.id=CartPole-v1", "env.num_envs=4"]
    impala += ["algo.num_steps=16", "agent.dim=16", "agent.layers=1", "agent.heads=2"]
    impala += ["agent.memory=8", "total_steps=128", "algo.optimizer=rmsprop", *quiet]
    impala += ["algo.rmsprop_momentum=0.5"]
    assert train_main([*impala, f"run_dir={root / 'impala'}"]) == 0
    collect = ["dataset_id=rltrans/st-v0", "env_id=CartPole-v1", "episodes=4", "num_envs=2"]
    collect += ["policy=rltrans.envs.scripted:CartPoleController", "max_episode_steps=20"]
    assert collect_main([*collect, "progress=false"]) == 0
    dt = ["agent=dt", "agent.context=4", "dataset=rltrans/st-v0", "train_steps=2"]
    dt += ["agent.dim=16", "agent.layers=1", "algo.batch_size=4", "algo.eval_episodes=1"]
    dt += ["algo.eval_num_targets=1", "algo.eval_max_steps=50", *quiet]
    assert train_main([*dt, f"run_dir={root / 'dt'}"]) == 0
    yield {"root": root, **{kind: root / kind for kind in ("ppo", "impala", "dt")}}
    mp.undo()


# One more update than each run saved: the edited state is loaded and then used.
RESUME = {"ppo": "total_steps=192", "impala": "total_steps=192", "dt": "train_steps=3"}
EXAMPLES = {"ppo": 20, "impala": 10, "dt": 10}


def state_paths(payload: dict) -> list[tuple]:
    """The key path of every trainer-state value and container in ``payload`` (the first
    three items of a list: an episode window would crowd out the rest)."""
    out: list[tuple] = []

    def walk(node, path: tuple) -> None:
        out.append(path)
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, (*path, key))
        elif isinstance(node, list | tuple):
            for index, child in enumerate(node[:3]):
                walk(child, (*path, index))

    for key, value in payload.items():
        if key not in NOT_STATE:
            walk(value, (key,))
    return out


def leaf_paths(payload: dict) -> list[tuple]:
    """The key path of every trainer-state value that is no container (tensors included)."""
    leaves = []

    def walk(node, path: tuple) -> None:
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, (*path, key))
        elif isinstance(node, list | tuple):
            for index, child in enumerate(node):
                walk(child, (*path, index))
        else:
            leaves.append(path)

    for key, value in payload.items():
        if key not in NOT_STATE:
            walk(value, (key,))
    return leaves


@st.composite
def state_edits(draw, payload: dict) -> list[tuple]:
    """1-2 edits (path, how) of ``payload``'s trainer state: ("tensor", edit) for a tensor,
    ("value", v) for any value, ("delete",) for a key."""
    paths = state_paths(payload)
    edits = []
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(paths))
        node = payload
        for key in path:
            node = node[key]
        kind = draw(st.sampled_from(["change", "change", "change", "delete"]))
        if kind == "delete" and not isinstance(path[-1], int):
            edits.append((path, ("delete",)))
        elif isinstance(node, torch.Tensor):
            allowed = (
                TENSOR_EDITS if path[:3] != MOMENTS else [e for e in TENSOR_EDITS if e != "huge"]
            )
            edits.append((path, ("tensor", draw(st.sampled_from(allowed)))))
        else:
            edits.append((path, ("value", draw(SCALARS))))
    return edits


def apply(payload: dict, edits: list[tuple]) -> dict:
    """``payload`` with ``edits`` made (a path an earlier edit replaced is left alone)."""
    for path, how in edits:
        _edit(payload, path, how)
    return payload


def _edit(node, path: tuple, how: tuple):
    """``node`` with the edit at ``path`` below it made (a tuple is rebuilt around it)."""
    key, rest = path[0], path[1:]
    if isinstance(node, dict):
        has = key in node
    else:
        has = isinstance(node, list | tuple) and isinstance(key, int) and key < len(node)
    if not has:  # an earlier edit replaced a node on the way
        return node
    if rest:
        new = _edit(node[key], rest, how)
    elif how[0] == "delete":
        if isinstance(node, dict):
            del node[key]
        return node
    elif how[0] == "tensor":
        if not isinstance(node[key], torch.Tensor):
            return node
        new = _edit_tensor(node[key], how[1])
    else:
        new = how[1]
    if isinstance(node, tuple):
        return (*node[:key], new, *node[key + 1 :])
    node[key] = new
    return node


def answer_ok(code: int, err: str, last: Path, problem: str | None) -> None:
    """What a resume of edited state may answer (see the module's docstring)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    if problem is not None:
        assert code == 2, err
        assert errors == [f"error: checkpoint {last}: {problem}"], err
        return
    assert code in (0, 1, 2), err
    if code == 1:
        assert "training stopped at step" in err, err
        assert "loss is" in err or "gradient norm is" in err, err
    if code == 2:
        assert len(errors) == 1 and errors[0].startswith(f"error: checkpoint {last}"), err


@pytest.mark.parametrize("kind", ["ppo", "impala", "dt"])
def test_every_saved_trainer_state_value_is_refused_or_used(kind, world, capsys):
    run = world[kind]
    original = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    start = peak_mb()

    @settings(FUZZ, max_examples=EXAMPLES[kind])
    @given(state_edits(original))
    def check(edits):
        folder = world["root"] / f"st-{kind}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(run, folder, symlinks=True)
        last = folder / "checkpoints" / "last.pt"
        payload = apply(torch.load(last, weights_only=True), edits)
        for step_file in last.parent.glob("step_*.pt"):
            step_file.unlink()  # resume reads last.pt: no fallback to an intact step file
        torch.save(payload, last)
        problem = saved_state_problem(payload)
        before = snapshot(world["root"])
        checkpoints = last.read_bytes()
        with time_limit():
            code = train_main(["resume=true", f"run_dir={folder}", RESUME[kind]])
        answer_ok(code, capsys.readouterr().err, last, problem)
        new = {p for p in snapshot(world["root"]) - before if not p.startswith(folder.name)}
        assert not new, f"written outside the example's folder: {sorted(new)[:5]}"
        if code == 2:
            assert last.read_bytes() == checkpoints  # a refusal writes no checkpoint

    check()
    assert peak_mb() - start < PEAK_GROWTH_MB


def _matches(pattern: str, path: tuple) -> bool:
    keys = pattern.split(".")
    return len(keys) == len(path) and all(
        k in ("*", str(p)) for k, p in zip(keys, path, strict=True)
    )


@pytest.mark.parametrize("kind", ["ppo", "impala", "dt"])
def test_every_value_a_trainer_saves_has_a_check(kind, world):
    payload = torch.load(world[kind] / "checkpoints" / "last.pt", weights_only=True)
    unchecked = [
        ".".join(map(str, path))
        for path in leaf_paths(payload)
        if not any(_matches(pattern, path) for pattern in FIELDS)
    ]
    assert not unchecked, f"saved trainer state no FIELDS entry checks: {unchecked}"
    assert saved_state_problem(payload) is None
