"""Train from Python: :func:`plan` resolves a run once, :func:`learn` runs it.

``python -m rltrans.train`` is a thin shell over these two calls, so a plan built in Python
from the command line's names trains exactly as that command line does::

    import rltrans

    options = {"env.id": "CartPole-v1", "algo.eval_every": 10}  # evaluate every 10 updates
    plan = rltrans.plan(agent="gtrxl", env="gym", total_steps=50_000, **options)
    print(plan.command)  # the same run from a shell
    summary = rltrans.learn(plan, on_eval=lambda step, m: m["eval/episodic_return"] < 475)

A :class:`RunPlan` is final once built: the config is composed and checked, fitted to
``agent.horizon``, merged with the saved run on ``resume=true`` (whose files pass the trust
checks), and its resources estimated. Nothing below it re-reads the command line; a bad value
raises :class:`rltrans.config.ConfigError` before any folder, env or process exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

from rltrans.accel.run_speed import SpeedSettings
from rltrans.config import ConfigError, config_groups, load_config, to_container
from rltrans.config.frozen import Frozen, freeze, thaw
from rltrans.config.plan import TRAINER_KINDS, RunPlan
from rltrans.config.run_settings import RunSettings, runtime_settings
from rltrans.learners.settings import AlgoConfig, algo_settings
from rltrans.trainers.common import Callbacks, MetricsHook


def resolve(cfg: DictConfig, overrides: Sequence[str] = ()) -> RunPlan:
    """The plan of a composed, checked config (:func:`rltrans.config.load_config`) and the
    command line it came from: horizon fit, resume merge and trust checks, resource
    estimate, trainer choice, each made here once."""
    from rltrans.api.horizon import fit_horizon, horizon_note
    from rltrans.api.resume import override_keys, settled_config
    from rltrans.config.applies import inapplicable
    from rltrans.config.resources import check_resources

    # agent.horizon before a resume too, so the command line it repeats compares equal to
    # the fitted config the run saved.
    cfg = fit_horizon(cfg, override_keys(overrides))
    cfg = settled_config(cfg, overrides)  # resume=true: the saved run, the given changes
    if cfg.get("resume"):  # a knob given that the saved run's choices leave idle
        problems = inapplicable(cfg, override_keys(overrides))
        if problems:
            raise ConfigError("\n".join(problems))
    check_resources(cfg)  # before a folder, env or process exists
    kind = cfg.algo.kind
    if kind not in TRAINER_KINDS:
        raise ConfigError(f"algo.kind={kind!r}; valid kinds: {', '.join(TRAINER_KINDS)}")
    try:
        algo = algo_settings(to_container(cfg.algo))
        runtime = runtime_settings(to_container(cfg.runtime))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    config = freeze(to_container(cfg))  # plain data from here on, read-only
    run = RunSettings.from_config(config)
    speed = speed_settings(config, run, algo)
    return RunPlan(config, kind, algo, run, runtime, tuple(overrides), speed, horizon_note(cfg))


def speed_settings(cfg: Frozen, run: RunSettings, algo: AlgoConfig) -> SpeedSettings:
    """A plan's speed settings: ``compile``, ``torch_threads``, ``rollout``,
    ``algo.chunk_obs_mb`` and what the compiled programs depend on (a later run of the same
    workload on this machine reuses ``compile=auto``'s decision: the budget, the seeds and
    the evaluation settings do not change the programs)."""
    sections = {k: thaw(cfg[k]) for k in ("agent", "algo", "env") if k in cfg}
    sections["dataset"] = run.dataset
    sections["algo"] = {k: v for k, v in sections.get("algo", {}).items() if "eval" not in k}
    return SpeedSettings(
        compile=run.compile,
        torch_threads=run.torch_threads,
        rollout=run.rollout,
        chunk_obs_mb=getattr(algo, "chunk_obs_mb", None),
        workload=sections,
        unrolled_chunks=unrolled_chunks(cfg),
    )


def unrolled_chunks(cfg: Frozen) -> int:
    """How many chunks a compiled training step unrolls (``agent.chunk`` within
    ``algo.segment_length``; 1 without); compile=auto expects
    :data:`~rltrans.accel.run_speed.CHUNK_COMPILE_SECONDS` of compilation for each."""
    chunk, length = cfg.agent.get("chunk"), cfg.algo.get("segment_length")
    if not chunk or not length:
        return 1
    return max(1, -(-int(length) // int(chunk)))


def plan(*overrides: str, **options: Any) -> RunPlan:
    """A plan from the command line's names: ``plan("agent=gru", "env.id=CartPole-v1")``, or
    as keywords, ``plan(agent="gru", env="gym", **{"env.id": "CartPole-v1"})``.

    A keyword that names a config group (``agent``, ``env``, ``algo``, ``runtime``) with a
    string picks its option; a mapping sets the keys below a name (``env={"num_envs": 8}``);
    any other keyword is a dotted key and its value. Raises ConfigError for a bad one.

    A keyword's value is a Python value, never parsed: a string holding ``${...}`` is refused
    rather than resolved (``run_dir="${oc.env:HOME}/x"`` would read the environment, and a
    config holding one could not be saved: run folders and checkpoints refuse it). An
    override string (``plan("run_dir=${oc.env:HOME}/x")``) is read as the command line reads
    it, interpolations resolved."""
    args = [*overrides]
    for key, value in options.items():
        args += _overrides(key, value)
    return resolve(load_config(args), args)


def learn(
    run: RunPlan, *, on_log: MetricsHook | None = None, on_eval: MetricsHook | None = None
) -> dict[str, Any]:
    """Train ``run``; returns the summary the command line prints.

    ``on_log(step, metrics)`` is called after each update's metrics are logged and
    ``on_eval(step, metrics)`` after each periodic evaluation; either may return False to
    stop after that update (checkpointed; status ``stopped_early``)."""
    if not isinstance(run, RunPlan):
        raise TypeError(f"learn() takes a RunPlan from rltrans.plan(), got {type(run).__name__}")
    if on_eval is not None and not run.algo.eval_every:
        # A callback that would never be called is a mistake, not a choice: say so before
        # the run starts rather than train to the end without ever asking it.
        raise ConfigError(
            "learn(on_eval=...) is called after each periodic evaluation, but this plan has "
            "algo.eval_every=0 (never); give it one, e.g. rltrans.plan(..., "
            '**{"algo.eval_every": 10}) (updates between evaluations)'
        )
    callbacks = Callbacks(on_log=on_log, on_eval=on_eval)
    if run.trainer == "online":
        from rltrans.trainers.ppo import train_ppo

        return train_ppo(run, callbacks)
    if run.trainer == "impala":
        from rltrans.trainers.impala import train_impala

        return train_impala(run, callbacks)
    from rltrans.trainers.offline import train_offline

    return train_offline(run, callbacks)


def _overrides(key: str, value: Any) -> list[str]:
    """``key=value`` overrides for one keyword of :func:`plan`."""
    if isinstance(value, Mapping):
        out = []
        for name, item in value.items():
            out += _overrides(f"{key}.{name}", item)
        return out
    _refuse_interpolation(key, value)
    if key in config_groups() and isinstance(value, str):
        return [f"{key}={value}"]
    if key in config_groups():
        raise ConfigError(
            f"{key}={value!r}: a config group takes an option's name (e.g. {key}="
            f"{'gtrxl' if key == 'agent' else '<option>'}) or a mapping of its keys"
        )
    return [f"{key}={_value(value)}"]


def _refuse_interpolation(key: str, value: Any) -> None:
    """ConfigError for a keyword value holding ``${``: Python values are taken literally, and
    a literal ``${`` could not be kept (rltrans's files refuse interpolations)."""
    items = value if isinstance(value, list | tuple) else [value]
    for item in items:
        if isinstance(item, list | tuple):
            _refuse_interpolation(key, item)
        elif not isinstance(item, bool | int | float | type(None)) and "${" in str(item):
            raise ConfigError(
                f"{key}={value!r}: a keyword's value is taken literally, never resolved, and a "
                f"config may not keep a literal ${{...}} (run folders and checkpoints refuse "
                f"one); give the value itself (os.environ, os.path.expandvars) or the override "
                f"string plan('{key}=...'), which is resolved as on the command line"
            )


def _value(value: Any) -> str:
    """``value`` in the override grammar (quoted where a plain word would be misread)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and not _misread(text):
        return text  # CartPole-v1, popgym:popgym-RepeatFirstEasy-v0, runs/x
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


_PLAIN = re.compile(r"[A-Za-z_][\w./:@-]*")


def _misread(text: str) -> bool:
    """Whether a plain word would be read as something other than this string."""
    if text.lower() in ("true", "false", "null", "none", "nan", "inf"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


__all__ = ["RunPlan", "learn", "plan", "resolve"]
