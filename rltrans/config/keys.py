"""What every key of the shipped configs accepts beyond its YAML default's type: ranges,
choices and null, one table per config section, and the size limits they use.

Choices are read from the code that consumes them (the ``Literal`` types of rltrans.core,
the agents and the envs, the agent registry, the ``kind`` lines of the group files), so a new
position scheme or agent needs no edit here. ``key@kind`` applies where the section's ``kind``
is that value. :mod:`rltrans.config.schema` checks a composed config against these tables.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace
from typing import get_args

from rltrans.config.files import group_kinds
from rltrans.config.resources import MAX_THREADS
from rltrans.config.spec import (
    BOOL,
    DEVICE,
    POSITIVE,
    SEED,
    Spec,
    choice,
    hint_spec,
    integer,
    number,
    string,
)
from rltrans.limits import (
    MAX_ENVS,
    MAX_EPISODES,
    MAX_LAYERS,
    MAX_LENGTH,
    MAX_SPACE_SIZE,
    MAX_STEPS,
    MAX_WIDTH,
)

THREADS = replace(integer(0, MAX_THREADS), default_words=("auto",))
UNIT = {"low": 0.0, "high": 1.0}  # number(**UNIT): a value in [0, 1]


def specs(config_name: str) -> dict[str, Spec]:
    """The explicit specs of a config by full key; ``key@kind`` applies where the section's
    ``kind`` is that value. Keys absent here take the type of their YAML default. Built per
    call: agents registered after import count."""
    tables = {
        "train": _train_specs,
        "evaluate": _evaluate_specs,
        "collect": _collect_specs,
        "export": _export_specs,
    }
    return tables[config_name]() if config_name in tables else {}


def _train_specs() -> dict[str, Spec]:
    """train.yaml and its groups."""
    return {**_run_specs(), **_agent_specs(), **_algo_specs(), **_runtime_specs(), **_env_specs()}


def _run_specs() -> dict[str, Spec]:
    """train.yaml's own keys: :class:`~rltrans.config.run_settings.RunSettings`' fields (the
    device's ``cuda:<n>`` pattern is no type, so its check is named here)."""
    from rltrans.config.run_settings import RunSettings

    return {**settings_specs("", [RunSettings]), "device": DEVICE}


def _agent_specs() -> dict[str, Spec]:
    """configs/agent/*.yaml."""
    from rltrans.agents.dt import DTBackbone
    from rltrans.agents.encoders import Activation, DictMode
    from rltrans.agents.memory_agent import BACKBONES, CRITICS
    from rltrans.backbones.causal import INITS
    from rltrans.core.act import HALTINGS
    from rltrans.core.attention import KERNELS
    from rltrans.core.block import ACTIVATIONS, FF_ACTIVATIONS, NORMS
    from rltrans.core.gates import GATES
    from rltrans.core.long_memory import FIRST_SCALE, LONG_MEMORIES
    from rltrans.core.position import POSITIONS
    from rltrans.registry import registered_agents

    return {
        "agent.kind": choice(registered_agents()),
        "agent.backbone@memory": choice(BACKBONES),
        "agent.backbone@dt": choice(get_args(DTBackbone)),
        "agent.backbone": choice(dict.fromkeys((*BACKBONES, *get_args(DTBackbone)))),
        "agent.dim": integer(1, MAX_WIDTH),
        "agent.layers": integer(1, MAX_LAYERS),
        # null = the backbone's default depth
        "agent.layers@memory": integer(1, MAX_LAYERS, null=True),
        "agent.heads": integer(1, MAX_WIDTH),
        "agent.memory": integer(0, MAX_LENGTH),
        "agent.compressed_slots": integer(1, MAX_LENGTH),
        "agent.compression_rate": integer(1, MAX_LENGTH),
        "agent.retention_scale": integer(int(FIRST_SCALE), 2**40, null=True),  # its floor
        "agent.span_ramp": integer(1, MAX_LENGTH),
        "agent.span_coef": number(0.0),
        "agent.value_init_gain": number(0.0, open_low=True),
        "agent.critic": choice(CRITICS),
        "agent.chunk": integer(1, MAX_LENGTH, null=True),
        "agent.context": integer(1, MAX_LENGTH),
        "agent.history": integer(1, MAX_LENGTH),
        "agent.max_timestep": integer(1, MAX_LENGTH, null=True),
        "agent.position": choice(POSITIONS),
        "agent.gate": choice(GATES),
        "agent.gate_bias": number(),
        "agent.norm": choice(NORMS),
        "agent.sublayer_activation": choice(ACTIVATIONS),
        "agent.ff_activation": choice(FF_ACTIVATIONS),
        "agent.activation": choice(FF_ACTIVATIONS),
        "agent.ff_mult": integer(1, 64),
        # BlockConfig options the YAML files leave at their defaults (+agent.x=)
        "agent.attn_dropout": number(0.0, 1.0, open_high=True),
        "agent.shaw_max_distance": integer(1, MAX_LENGTH),
        "agent.max_len": integer(1, MAX_LENGTH),
        "agent.dropout": number(0.0, 1.0, open_high=True),
        "agent.kernel": choice(KERNELS),
        "agent.long_memory": choice(LONG_MEMORIES),
        # null = as configured; auto = the torch-native task's time limit
        "agent.horizon": replace(integer(1, MAX_LENGTH, null=True), default_words=("auto",)),
        "agent.init": choice(INITS),
        "agent.halting": choice(HALTINGS),
        "agent.max_steps": integer(1, MAX_LAYERS),
        "agent.act_epsilon": number(**UNIT, open_low=True, open_high=True),
        "agent.halting_bias": number(),
        "agent.tau": number(0.0),
        "agent.coordinate_scale": number(0.0),
        "agent.encoder.hidden_dim": integer(1, MAX_WIDTH),
        "agent.encoder.dict_mode": choice(get_args(DictMode)),
        "agent.encoder.activation": choice(get_args(Activation)),
    }


def _algo_specs() -> dict[str, Spec]:
    """configs/algo/*.yaml (PPO, IMPALA, offline): each key's type and range are its typed
    settings field's (rltrans.learners.settings); the DQN Replay reader's choices its own."""
    from rltrans.envs.dqn_replay import Order, Padding, Partial
    from rltrans.learners.settings import ALGO_SETTINGS

    return {
        "algo.kind": choice(group_kinds("algo")),
        **settings_specs("algo", ALGO_SETTINGS.values()),
        "algo.dqn_replay.root": string(null=True),
        "algo.dqn_replay.padding": choice(get_args(Padding)),
        "algo.dqn_replay.order": choice(get_args(Order)),
        "algo.dqn_replay.partial": choice(get_args(Partial)),
        "algo.dqn_replay.frame_stack": POSITIVE,
    }


def settings_specs(section: str, classes: typing.Iterable[type]) -> dict[str, Spec]:
    """``section.<field>``'s spec (``<field>``'s for the top level, ``section=""``) for every
    field of these settings classes: the annotation's type with the field's range
    (``knob(low=..., high=...)``). A field two classes share must
    accept the same values in both (one key, one check); ``kind`` and mappings are left out."""
    from rltrans.learners.settings import knob_of

    table: dict[str, Spec] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            spec = hint_spec(hints[f.name])
            if f.name == "kind" or spec is None:
                continue
            k = knob_of(f)
            spec = replace(
                spec,
                low=k.low,
                high=k.high,
                open_low=k.open_low,
                open_high=k.open_high,
                nonempty=k.nonempty,
            )
            key = f"{section}.{f.name}" if section else f.name
            if table.setdefault(key, spec) != spec:
                raise TypeError(
                    f"{key}: {cls.__name__} accepts {spec.describe()}, another "
                    f"settings class {table[key].describe()}"
                )
    return table


def _runtime_specs() -> dict[str, Spec]:
    """configs/runtime/*.yaml: where IMPALA's actors run (PPO ignores it), from the fields of
    :data:`~rltrans.config.run_settings.RUNTIMES`."""
    from rltrans.config.run_settings import RUNTIMES

    return {
        "runtime.kind": choice(group_kinds("runtime")),
        **settings_specs("runtime", RUNTIMES.values()),
    }


def _env_specs() -> dict[str, Spec]:
    """configs/env/*.yaml."""
    from rltrans.envs.gym_vec import make_vector_env
    from rltrans.envs.torch_envs import TORCH_ENVS

    gym_hints = typing.get_type_hints(make_vector_env)
    return {
        "env.kind": choice(group_kinds("env")),
        "env.id": string(),
        "env.name": choice(TORCH_ENVS),
        "env.num_envs": integer(1, MAX_ENVS),
        "env.num_envs@dataset": integer(1, MAX_ENVS, null=True),
        "env.vectorization": hint_spec(gym_hints["vectorization"]) or string(),
        "env.atari": hint_spec(gym_hints["atari"]) or string(),
        # per-env wrappers: {path: import path, kwargs: {...}, phase: both|training|evaluation}
        "env.wrappers": Spec("list", item_keys=("path", "kwargs", "phase")),
        "env.kwargs": Spec("mapping"),
        # torch-env constructor arguments with ranges (their types come from the signatures)
        "env.kwargs.length@torch": integer(1, MAX_LENGTH),
        "env.kwargs.k@torch": integer(0, MAX_LENGTH),
        "env.kwargs.num_symbols@torch": integer(2, MAX_LENGTH),
        "env.kwargs.episode_length@torch": integer(1, MAX_STEPS),
        "env.kwargs.max_episode_steps@torch": integer(1, MAX_STEPS, null=True),
    }


def _evaluate_specs() -> dict[str, Spec]:
    """evaluate.yaml."""
    return {
        "checkpoint": string(null=True),  # required: rltrans.evaluate says so when it is null
        "episodes": integer(1, MAX_EPISODES),
        "num_envs": integer(1, MAX_ENVS, null=True),
        "deterministic": replace(BOOL, nullable=True),
        "device": DEVICE,
        "seed": SEED,
        "max_steps": integer(1, MAX_STEPS),
        "torch_threads": THREADS,
        "video_dir": string(null=True),
        "target_return": Spec("numbers", nullable=True),
        "env_id": string(null=True),
    }


def _collect_specs() -> dict[str, Spec]:
    """collect.yaml."""
    return {
        "dataset_id": string(null=True),  # required: rltrans.collect says so when it is null
        "policy": string(),
        "epsilon": Spec("numbers", 0.0, 1.0),
        "episodes": integer(1, MAX_EPISODES),
        "env_id": string(null=True),
        "max_episode_steps": integer(1, null=True),
        "num_envs": integer(1, MAX_ENVS),
        "seed": SEED,
        "deterministic": replace(BOOL, nullable=True),
        "target_return": number(null=True),
        "device": DEVICE,
        "torch_threads": THREADS,
        "author_email": string(null=True),
        "description": string(null=True),
        "ref_min_score": number(null=True),
        "ref_max_score": number(null=True),
    }


# What `python -m rltrans.export` writes (rltrans.deploy): an ONNX model | a torch.export
# archive (.pt2). Defined here, below the deploy layer, so the export section checks it.
Format = typing.Literal["onnx", "torch"]
FORMATS: tuple[str, ...] = get_args(Format)


def _export_specs() -> dict[str, Spec]:
    """export.yaml."""
    return {
        "checkpoint": string(null=True),  # required: rltrans.export says so when it is null
        "format": choice(FORMATS),
        "out": replace(string(null=True), nonempty=True),
        "target_return": number(null=True),
    }


__all__ = [
    "FORMATS",
    "MAX_ENVS",
    "MAX_EPISODES",
    "MAX_LAYERS",
    "MAX_LENGTH",
    "MAX_SPACE_SIZE",
    "MAX_STEPS",
    "MAX_WIDTH",
    "THREADS",
    "Format",
    "specs",
]
