"""What every key of the shipped configs accepts beyond its YAML default's type: ranges,
choices and null, one table per config section, and the size limits they use.

Choices are read from the code that consumes them (the ``Literal`` types of rltrans.core,
the agents and the envs, the agent registry, the ``kind`` lines of the group files), so a new
position scheme or agent needs no edit here. ``key@kind`` applies where the section's ``kind``
is that value. :mod:`rltrans.config.schema` checks a composed config against these tables.
"""

from __future__ import annotations

import typing
from dataclasses import replace
from typing import get_args

from rltrans.config.files import group_kinds
from rltrans.config.resources import MAX_ACTORS, MAX_THREADS
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

# Size limits, far above any real run and far below what would exhaust memory before the
# resource estimate (rltrans.config.resources) runs: a file's agent.dim: 1e8 stops here.
MAX_WIDTH = 2**16  # model widths, heads
MAX_LAYERS = 1024  # stacked or looped blocks
MAX_LENGTH = 2**20  # windows, memories, contexts, rollout lengths, episode lengths
MAX_ENVS = 2**20  # parallel envs, batch sizes
MAX_STEPS = 10**15  # budgets in env or gradient steps (int64 step counters and logs)
MAX_EPISODES = 10**7  # evaluation episodes
MAX_SPACE_SIZE = 2**26  # elements of one shape a wrapper is given (an 8K RGB frame: 2^25)
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
    """train.yaml's own keys."""
    from rltrans.accel.rollout import ROLLOUTS
    from rltrans.envs.offline import DATASET_KINDS

    return {
        "seed": SEED,
        "device": DEVICE,
        "total_steps": integer(1, MAX_STEPS),
        "train_steps": integer(1, MAX_STEPS),
        "dataset": string(null=True),
        "dataset_kind": choice(DATASET_KINDS),
        "run_dir": replace(string(null=True), nonempty=True),
        "checkpoint_every": POSITIVE,
        "keep_checkpoints": POSITIVE,  # CheckpointManager needs keep_last >= 1
        "torch_threads": THREADS,
        "compile": replace(BOOL, default_words=("auto",)),
        "rollout": choice(ROLLOUTS),
    }


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
    """configs/algo/*.yaml (PPO, IMPALA, offline)."""
    from rltrans.envs.dqn_replay import Order, Padding, Partial
    from rltrans.learners.settings import ADVANTAGE_SCOPES

    return {
        "algo.kind": choice(group_kinds("algo")),
        "algo.num_steps": integer(1, MAX_LENGTH),
        "algo.segment_length": integer(1, MAX_LENGTH),
        "algo.epochs": integer(1, 10_000),
        "algo.num_minibatches": integer(1, MAX_ENVS),
        "algo.chunk_obs_mb": number(0.0, open_low=True, null=True),
        "algo.gamma": number(**UNIT, open_low=True),
        "algo.gae_lambda": number(**UNIT),
        "algo.clip_coef": number(0.0, open_low=True, null=True),
        "algo.vf_clip_coef": number(0.0, open_low=True, null=True),
        "algo.ent_coef": number(0.0),
        "algo.reconstruction_coef": number(0.0),  # ppo / impala (offline.yaml has no such key)
        "algo.min_advantage_std": number(0.0),
        "algo.advantage_scope": choice(ADVANTAGE_SCOPES),
        "algo.vf_coef": number(0.0),
        "algo.target_kl": number(0.0, open_low=True, null=True),
        "algo.lr": number(0.0, open_low=True),
        "algo.max_grad_norm": number(0.0, open_low=True, null=True),
        "algo.batch_size": integer(1, MAX_ENVS),
        "algo.context": integer(1, MAX_LENGTH, null=True),
        "algo.weight_decay": number(0.0),
        "algo.adam_eps": number(0.0, open_low=True),
        "algo.warmup_updates": integer(0),
        "algo.log_every": POSITIVE,
        "algo.return_scale": number(0.0, open_low=True, null=True),
        "algo.top_fraction": number(**UNIT, open_low=True),
        "algo.eval_every": integer(0),
        "algo.eval_episodes": integer(0, MAX_EPISODES),
        "algo.eval_targets": Spec("numbers", nullable=True),
        "algo.eval_num_targets": integer(1, 1000),
        "algo.eval_max_steps": POSITIVE,
        "algo.dqn_replay.root": string(null=True),
        "algo.dqn_replay.padding": choice(get_args(Padding)),
        "algo.dqn_replay.order": choice(get_args(Order)),
        "algo.dqn_replay.partial": choice(get_args(Partial)),
        "algo.dqn_replay.frame_stack": POSITIVE,
        # algo=impala
        "algo.batch_rollouts": integer(1, MAX_ENVS),
        "algo.rho_bar": number(0.0, open_low=True),
        "algo.c_bar": number(0.0, open_low=True),
        "algo.pg_rho_bar": number(0.0, open_low=True, null=True),
        "algo.vtrace_lambda": number(**UNIT),
        "algo.optimizer": choice(("rmsprop", "adam")),
        "algo.rmsprop_alpha": number(**UNIT, open_high=True),
        "algo.rmsprop_eps": number(0.0, open_low=True),
        "algo.rmsprop_momentum": number(**UNIT, open_high=True),
        "algo.max_policy_lag": integer(0),
    }


def _runtime_specs() -> dict[str, Spec]:
    """configs/runtime/*.yaml: where IMPALA's actors run (PPO ignores it)."""
    return {
        "runtime.kind": choice(group_kinds("runtime")),
        "runtime.num_actors": integer(1, MAX_ACTORS),
        "runtime.envs_per_actor": integer(1, MAX_ENVS, null=True),
        "runtime.slots": integer(1, MAX_ENVS, null=True),
        "runtime.start_method": choice(("spawn", "forkserver")),
        "runtime.max_restarts": integer(0),
        "runtime.address": string(null=True),
        "runtime.num_cpus_per_actor": number(0.0),
        "runtime.rollouts_in_flight": integer(1, 1024),
        "runtime.object_store_memory": integer(75 * 2**20, null=True),  # Ray: >= 75 MiB
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


def _export_specs() -> dict[str, Spec]:
    """export.yaml."""
    from rltrans.deploy import FORMATS

    return {
        "checkpoint": string(null=True),  # required: rltrans.export says so when it is null
        "format": choice(FORMATS),
        "out": replace(string(null=True), nonempty=True),
        "target_return": number(null=True),
    }


__all__ = [
    "MAX_ENVS",
    "MAX_EPISODES",
    "MAX_LAYERS",
    "MAX_LENGTH",
    "MAX_SPACE_SIZE",
    "MAX_STEPS",
    "MAX_WIDTH",
    "THREADS",
    "specs",
]
