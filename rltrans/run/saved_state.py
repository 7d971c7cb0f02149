"""The trainer state a checkpoint holds besides its weights, config and spaces, field by
field: what every saved value may be (type, range, finiteness, shape), in one table,
:data:`FIELDS`, checked before a resumed run builds anything.

A value outside these bounds is not a run's: it would crash the process (a thread count of
10^5 aborts it inside libgomp, an out-of-range NumPy position segfaults it), break the first
update (a string or NaN learning rate, NaN Adam moments, a negative reward variance) or
silently continue as another run (a negative update counter). Each is one CheckpointError
naming the file, the field, the value and what is valid.

A field is a path of keys (``*``: every key or index there); a path absent from the
checkpoint (an older rltrans, a trainer without that part) is not checked. Containers are
entries of their own: a mapping's allowed and required keys, a list's length.

>>> check_saved_state({"update": -1, "global_step": 0}, "checkpoint x.pt")
Traceback (most recent call last):
...
rltrans.run.checkpoint.CheckpointError: checkpoint x.pt: update=-1: expected an integer in [0, 2^53)
"""

from __future__ import annotations

import json
import random
import reprlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from rltrans.config.errors import first_line
from rltrans.config.resources import MAX_ACTORS, MAX_THREADS
from rltrans.config.spec import Spec, choice, integer, number
from rltrans.run.checkpoint import CheckpointError
from rltrans.run.rng import restore_rng_state

# Counters stay below 2^53: float64 (logs, rates) holds every integer up to it exactly.
MAX_COUNT = 2**53
MAX_RANKS = 4096  # learner processes whose reward scalers one checkpoint holds
MAX_ITEMS = 2**16  # entries of a saved list (episode window, parameter ids, groups)
MAX_JSON = 4096  # characters of a generator state saved as JSON

# A problem's text, from the field's name and its value; None when the value is valid.
Check = Callable[[str, Any], "str | None"]

_SHOW = reprlib.Repr()
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 40, 40, 40


def show(value: Any) -> str:
    """A saved value as an error line quotes it (short; a 0-d tensor as its number)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not value.is_complex():
            return repr(value.item())
        return f"tensor of shape {tuple(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    return _SHOW.repr(value)


# ----------------------------------------------------------------------------- checks


def value(spec: Spec) -> Check:
    """A plain value of ``spec``'s type (exactly: 3.0 is no count, True no number) and range."""
    kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "choice": (str,)}

    def check(name: str, found: Any) -> str | None:
        typed = found is None or (
            isinstance(found, kinds[spec.type])
            and (spec.type == "bool" or not isinstance(found, bool))
        )
        if typed and spec.check(found)[0]:
            return None
        return f"{name}={show(found)}: expected {spec.describe()}"

    return check


def exactly(expected: Any, why: str) -> Check:
    """One value only (``why``: who sets it)."""

    def check(name: str, found: Any) -> str | None:
        same = type(found) is type(expected) and found == expected
        return None if same else f"{name}={show(found)}: expected {show(expected)} ({why})"

    return check


def mapping(
    allowed: tuple[str, ...] = (), required: tuple[str, ...] = (), *, null: bool = False
) -> Check:
    """A mapping with ``required`` keys and (``allowed`` given) no keys but ``allowed``;
    ``null``: None too (a trainer part a checkpoint leaves out)."""

    def check(name: str, found: Any) -> str | None:
        if found is None and null:
            return None
        if not isinstance(found, dict):
            return f"{name}={show(found)}: expected a mapping"
        missing = [k for k in required if k not in found]
        if missing:
            return f"{name} lacks {', '.join(map(repr, missing))}"
        if allowed:
            other = [k for k in found if k not in allowed]
            if other:
                valid = ", ".join(allowed)
                return f"{name} holds {show(other[0])}, which rltrans never saves; valid: {valid}"
        return None

    return check


def items(most: int, *, exact: int | None = None) -> Check:
    """A list (or tuple) of at most ``most`` items (exactly ``exact`` where given)."""

    def check(name: str, found: Any) -> str | None:
        if not isinstance(found, list | tuple):
            return f"{name}={show(found)}: expected a list"
        if exact is not None and len(found) != exact:
            return f"{name} holds {len(found)} items: expected {exact}"
        if len(found) > most:
            return f"{name} holds {len(found)} items: expected at most {most}"
        return None

    return check


def tensor(
    bounds: Spec | None = None,
    *,
    shape: tuple[int, ...] | Callable[[], tuple[int, ...]] | None = None,
    dtype: torch.dtype | None = None,
) -> Check:
    """A tensor (of ``dtype``, else of a real floating type; of ``shape`` where given) whose
    every value is finite and in ``bounds``' range."""
    spec = bounds or number()
    within = Spec("float", spec.low, spec.high, spec.open_low, spec.open_high).describe()
    within = within.removeprefix("a number")  # " >= 0", " in [0, 2^53)" or nothing

    def check(name: str, found: Any) -> str | None:
        if not isinstance(found, torch.Tensor):
            return f"{name}={show(found)}: expected a tensor"
        want = shape() if callable(shape) else shape
        if want is not None and tuple(found.shape) != want:
            return f"{name} has shape {tuple(found.shape)}: expected {want}"
        if found.dtype != dtype if dtype is not None else not found.is_floating_point():
            kind = str(found.dtype).removeprefix("torch.")
            expected = str(dtype).removeprefix("torch.") if dtype else "a floating-point type"
            return f"{name} is a {kind} tensor: expected {expected}"
        bad = _outside(found.detach(), spec)
        count = int(bad.sum())
        if not count:
            return None
        first = found.detach()[bad].flatten()[0].item()
        if found.dim() == 0:
            return f"{name}={first!r}: expected a finite number{within}"
        return (
            f"{name} holds {count} value(s) that are not a finite number{within} "
            f"(the first: {first!r})"
        )

    return check


def _outside(values: torch.Tensor, spec: Spec) -> torch.Tensor:
    """Where ``values`` are not finite or outside ``spec``'s range (in their own dtype: a
    float64 copy of a large model's moments would double what a resume holds)."""
    if values.is_floating_point():
        bad = ~torch.isfinite(values)
    else:
        bad = torch.zeros(values.shape, dtype=torch.bool)
    if spec.low is not None:
        bad |= values <= spec.low if spec.open_low else values < spec.low
    if spec.high is not None:
        bad |= values >= spec.high if spec.open_high else values > spec.high
    return bad


def generator(kind: str) -> Check:
    """A generator state that a scratch generator of ``kind`` accepts (``python``: random's
    (version, state, gauss_next); ``torch``: torch's CPU generator; ``pcg64``: NumPy PCG64's
    state as JSON text), so a state the library refuses is named before anything is built."""

    def check(name: str, found: Any) -> str | None:
        try:
            if kind == "python":
                state = tuple(int(x) for x in found["state"].tolist())
                random.Random().setstate((found["version"], state, found["gauss_next"]))
            elif kind == "torch":
                torch.Generator().set_state(found)
            else:
                if not isinstance(found, str) or len(found) > MAX_JSON:
                    return f"{name}={show(found)}: expected a JSON text of a PCG64 state"
                _pcg64(json.loads(found))
        except (TypeError, ValueError, OverflowError, RuntimeError, KeyError) as err:
            return f"{name}: not a valid {kind} generator state ({first_line(err, 120)})"
        return None

    return check


def _pcg64(state: Any) -> None:
    """Set ``state`` on a scratch PCG64 (ValueError/TypeError/OverflowError when invalid)."""
    if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
        raise ValueError("expected a mapping with bit_generator 'PCG64'")
    np.random.PCG64().state = state


# ----------------------------------------------------------------------------- the table


COUNT = value(Spec("int", 0, MAX_COUNT, open_high=True))
NON_NEGATIVE = number(0.0)
RATE = value(NON_NEGATIVE)  # a learning rate, a weight decay: finite and >= 0
FLAG = value(Spec("bool"))
THREADS = value(integer(1, MAX_THREADS, null=True))
WORD = integer(0, 2**32 - 1)  # a Mersenne Twister state word
NEVER = "rltrans never sets it"
SCALER = {  # rltrans.runtime.actors.RewardScaler
    "": mapping(("count", "mean", "var", "peak"), ("count", "mean", "var"), null=True),
    ".count": tensor(number(0.0, open_low=True), shape=()),
    ".mean": tensor(shape=()),
    ".var": tensor(NON_NEGATIVE, shape=()),
    ".peak": tensor(NON_NEGATIVE, shape=()),
}
SCHEDULER_KEYS = (  # LambdaLR's state: its loader sets every key as an attribute
    "base_lrs", "last_epoch", "_step_count", "_is_initial", "_get_lr_called_within_step",
    "_last_lr", "lr_lambdas", "verbose",
)  # fmt: skip
GRAD_SCALER_KEYS = (
    "scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "_growth_tracker",
)
GROUP = "learner.optimizer.param_groups.*"
MOMENTS = "learner.optimizer.state.*"

FIELDS: dict[str, Check] = {
    # counters (rltrans.run.context.Run.payload, trainers.common.TrainerState, IMPALA's Count)
    "global_step": COUNT,
    "update": COUNT,
    "dropped": COUNT,
    # speed choices (rltrans.trainers.common.Tuners / Choice)
    "threads": mapping(null=True),
    "threads.*": mapping(("chosen", "streams"), required=("chosen",)),
    "threads.*.chosen": THREADS,
    "threads.*.streams": THREADS,
    "compile": value(choice(("compiled", "eager"), null=True)),
    # the episode window (rltrans.run.logging.EpisodeTracker checks its values itself)
    "episodes": mapping(
        ("returns", "lengths", "successes", "episodes_seen"),
        required=("returns", "lengths", "successes", "episodes_seen"),
        null=True,
    ),
    "episodes.returns": items(MAX_ITEMS),
    "episodes.returns.*": value(number()),
    "episodes.lengths": items(MAX_ITEMS),
    "episodes.lengths.*": COUNT,
    "episodes.successes": items(MAX_ITEMS),
    "episodes.successes.*": FLAG,
    "episodes.episodes_seen": COUNT,
    # reward scalers: PPO's one; IMPALA's per actor, per learner process (older: a list)
    **{f"reward_scaler{k}": c for k, c in SCALER.items()},
    "reward_scalers": mapping(("own", "by_rank"), ("own", "by_rank"), null=True),
    "reward_scalers.own": items(MAX_ACTORS),
    "reward_scalers.by_rank": items(MAX_RANKS),
    "reward_scalers.by_rank.*": items(MAX_ACTORS),
    **{f"reward_scalers.own.*{k}": c for k, c in SCALER.items()},
    **{f"reward_scalers.by_rank.*.*{k}": c for k, c in SCALER.items()},
    # the learner (rltrans.learners.base.Learner): AdamW or RMSprop, LambdaLR, GradScaler
    "learner": mapping(("optimizer", "scheduler", "scaler"), required=("optimizer", "scheduler")),
    "learner.optimizer": mapping(("state", "param_groups"), required=("state", "param_groups")),
    "learner.optimizer.state": mapping(),
    MOMENTS: mapping(),
    f"{MOMENTS}.step": tensor(Spec("float", 0, MAX_COUNT, open_high=True), shape=()),
    f"{MOMENTS}.exp_avg": tensor(),
    f"{MOMENTS}.exp_avg_sq": tensor(NON_NEGATIVE),
    f"{MOMENTS}.max_exp_avg_sq": tensor(NON_NEGATIVE),
    f"{MOMENTS}.square_avg": tensor(NON_NEGATIVE),
    f"{MOMENTS}.momentum_buffer": tensor(),
    f"{MOMENTS}.grad_avg": tensor(),
    "learner.optimizer.param_groups": items(MAX_ITEMS),
    GROUP: mapping(required=("params",)),
    f"{GROUP}.params": items(MAX_ITEMS),
    f"{GROUP}.params.*": COUNT,
    f"{GROUP}.lr": RATE,
    f"{GROUP}.initial_lr": RATE,
    f"{GROUP}.weight_decay": RATE,
    f"{GROUP}.eps": value(number(0.0, open_low=True)),
    f"{GROUP}.betas": items(2, exact=2),
    f"{GROUP}.betas.*": value(number(0.0, 1.0, open_high=True)),
    f"{GROUP}.alpha": value(number(0.0, 1.0)),
    f"{GROUP}.momentum": value(number(0.0, 1.0, open_high=True)),
    f"{GROUP}.centered": FLAG,
    f"{GROUP}.amsgrad": FLAG,
    f"{GROUP}.decoupled_weight_decay": FLAG,
    f"{GROUP}.foreach": value(Spec("bool", nullable=True)),
    f"{GROUP}.fused": value(Spec("bool", nullable=True)),
    f"{GROUP}.maximize": exactly(False, NEVER),
    f"{GROUP}.capturable": exactly(False, NEVER),
    f"{GROUP}.differentiable": exactly(False, NEVER),
    "learner.scheduler": mapping(SCHEDULER_KEYS, required=("lr_lambdas",)),
    "learner.scheduler.base_lrs": items(MAX_ITEMS),
    "learner.scheduler.base_lrs.*": RATE,
    "learner.scheduler._last_lr": items(MAX_ITEMS),
    "learner.scheduler._last_lr.*": RATE,
    "learner.scheduler.last_epoch": COUNT,
    "learner.scheduler._step_count": COUNT,
    "learner.scheduler._is_initial": FLAG,
    "learner.scheduler._get_lr_called_within_step": FLAG,
    "learner.scheduler.lr_lambdas": items(MAX_ITEMS),
    "learner.scheduler.lr_lambdas.*": exactly(None, "rltrans's schedules save no state"),
    "learner.scaler": mapping(GRAD_SCALER_KEYS, null=True),
    "learner.scaler.scale": value(number(0.0, open_low=True)),
    "learner.scaler.growth_factor": value(number(1.0, open_low=True)),
    "learner.scaler.backoff_factor": value(number(0.0, 1.0, open_low=True, open_high=True)),
    "learner.scaler.growth_interval": value(integer(1, 2**31 - 1)),
    "learner.scaler._growth_tracker": value(integer(0, 2**31 - 1)),
    # the global generators (rltrans.run.rng) and the offline window sampler's
    "rng": mapping(("python", "numpy", "torch", "cuda")),
    "rng.python": mapping(("version", "state", "gauss_next"), ("version", "state", "gauss_next")),
    "rng.python.version": exactly(3, "Python's random writes version 3"),
    "rng.python.state": tensor(WORD, shape=(625,), dtype=torch.int64),
    "rng.python.gauss_next": value(number(null=True)),
    "rng.numpy": mapping(
        ("name", "keys", "pos", "has_gauss", "cached_gaussian"),
        ("name", "keys", "pos", "has_gauss", "cached_gaussian"),
    ),
    "rng.numpy.name": exactly("MT19937", "NumPy's legacy generator"),
    "rng.numpy.keys": tensor(WORD, shape=(624,), dtype=torch.int64),
    "rng.numpy.pos": value(integer(0, 624)),
    "rng.numpy.has_gauss": value(integer(0, 1)),
    "rng.numpy.cached_gaussian": value(number()),
    "rng.torch": tensor(shape=lambda: tuple(torch.get_rng_state().shape), dtype=torch.uint8),
    "rng.cuda": items(MAX_ITEMS),
    "rng.cuda.*": tensor(dtype=torch.uint8),
    "sampler_rng": generator("pcg64"),
}


def moments(name: str, optimizer: Any) -> str | None:
    """Every parameter's saved state holds what its optimizer's step reads (a state that is
    not empty is used as it is): Adam(W)'s step and two moments (a third with amsgrad),
    RMSprop's step and square average (a momentum buffer with momentum, a gradient average
    when centered)."""
    for group in optimizer["param_groups"]:
        if "betas" in group:
            needs = ["step", "exp_avg", "exp_avg_sq"] + ["max_exp_avg_sq"] * bool(
                group.get("amsgrad")
            )
        else:
            needs = ["step", "square_avg"] + ["momentum_buffer"] * bool(group.get("momentum"))
            needs += ["grad_avg"] * bool(group.get("centered"))
        for key in group["params"]:
            state = optimizer["state"].get(key) or {}
            missing = [k for k in needs if k not in state]
            if state and missing:
                return f"{_name(name + '.state', key)} lacks {', '.join(map(repr, missing))}"
    return None


# Whole parts, once FIELDS passed their fields: generator states set on a scratch generator
# of their library, the optimizer's per-parameter state against its groups.
WHOLE: dict[str, Check] = {
    "rng.python": generator("python"),
    "rng.torch": generator("torch"),
    "learner.optimizer": moments,
}
# (smaller, larger): an update takes at least one step of the budget.
AT_MOST = (("update", "global_step"),)


def _nodes(node: Any, keys: list[str], path: str) -> Iterator[tuple[str, Any]]:
    """(name, value) of every value at ``keys`` below ``node`` (``*``: each key or index);
    a path that is absent, or that the checkpoint's layout does not have, yields nothing."""
    if not keys:
        yield path, node
        return
    key, rest = keys[0], keys[1:]
    if isinstance(node, dict):
        chosen = list(node.items()) if key == "*" else [(key, node[key])] if key in node else []
    elif isinstance(node, list | tuple) and key == "*":
        chosen = list(enumerate(node))
    else:
        return
    for k, child in chosen:
        name = _name(path, k)
        if child is not None or not rest:
            yield from _nodes(child, rest, name)


def _name(path: str, key: Any) -> str:
    """``path.key``; ``path[key]`` for an index or a key that is no identifier."""
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _layout(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with IMPALA's reward scalers in today's layout (older: a list of one
    learner process's scalers)."""
    scalers = payload.get("reward_scalers")
    if isinstance(scalers, list):
        return {**payload, "reward_scalers": {"own": scalers, "by_rank": []}}
    return payload


def saved_state_problem(payload: dict[str, Any]) -> str | None:
    """The first field of a checkpoint's trainer state outside :data:`FIELDS`' bounds (or of
    :data:`AT_MOST`'s order), as ``field=value: expected ...``; None when all are valid."""
    payload = _layout(payload)
    # A container is checked before the fields in it (FIELDS lists them in that order).
    for pattern, check in (*FIELDS.items(), *WHOLE.items()):
        for name, found in _nodes(payload, pattern.split("."), ""):
            problem = check(name, found)
            if problem is not None:
                return problem
    for small, large in AT_MOST:
        a, b = payload.get(small), payload.get(large)
        if isinstance(a, int) and isinstance(b, int) and a > b:
            return f"{small}={a} is more than {large}={b}: every {small} takes at least one step"
    return None


def check_saved_state(payload: dict[str, Any], source: str) -> None:
    """Refuse a checkpoint whose trainer state is outside :data:`FIELDS`: one CheckpointError
    ``<source>: <field>=<value>: expected <what is valid>``."""
    problem = saved_state_problem(payload)
    if problem is not None:
        raise CheckpointError(f"{source}: {problem}")


def restore_payload(payload: dict[str, Any], agent: torch.nn.Module, learner: Any) -> int:
    """Load a checkpoint's weights, learner state and RNG states; returns its step."""
    agent.load_state_dict(payload["model"])
    learner.load_state_dict(payload["learner"])
    restore_rng_state(payload["rng"])
    step = payload["global_step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"global_step={step!r} is not a step count")
    return step


__all__ = ["FIELDS", "MAX_COUNT", "check_saved_state", "restore_payload", "saved_state_problem"]
