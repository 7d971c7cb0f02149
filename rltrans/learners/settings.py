"""The typed settings a learner takes whole: one frozen dataclass per ``algo`` kind, whose
fields are that YAML file's keys with its defaults (``configs/algo/ppo.yaml``, ``impala.yaml``,
``offline.yaml``), and the optimizer's settings they share.

The run plan (:func:`rltrans.api.resolve`) builds the one that matches ``algo.kind`` once,
with :func:`algo_settings`; the trainer hands it to its learner, which reads nothing else::

    settings = PPOConfig(epochs=2, lr=1e-3)
    learner = PPOLearner(agent, settings, total_updates=10)

Building one from a mapping refuses a key the kind does not have, naming it and the kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

AdvantageScope = Literal["minibatch", "rollout"]
ADVANTAGE_SCOPES: tuple[str, ...] = get_args(AdvantageScope)


@dataclass(frozen=True)
class OptimizerConfig:
    """Adam(W) with a linear warmup and decay, a global gradient-norm clip and AMP on CUDA."""

    lr: float = 3e-4  # learning rate
    anneal_lr: bool = True  # linear decay to 0 over the run's updates
    warmup_updates: int = 0  # linear warmup over this many updates; 0 = none
    max_grad_norm: float | None = 0.5  # global gradient-norm clip; None = none
    weight_decay: float = 0.0  # AdamW weight decay
    eps: float = 1e-5  # Adam epsilon
    amp: bool = False  # bfloat16 autocast on CUDA (ignored elsewhere)


@dataclass(frozen=True)
class PPOConfig:
    """``algo=ppo``: PPO with GAE on segments of ``segment_length`` steps."""

    kind: Literal["online"] = "online"
    num_steps: int = 128
    segment_length: int = 16
    epochs: int = 4
    num_minibatches: int = 8
    chunk_obs_mb: float | None = None
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float | None = 0.2
    vf_clip_coef: float | None = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    reconstruction_coef: float = 0.0
    normalize_advantages: bool = True
    advantage_scope: AdvantageScope = "minibatch"
    min_advantage_std: float = 0.0
    target_kl: float | None = None
    lr: float = 3e-4
    anneal_lr: bool = True
    max_grad_norm: float | None = 0.5
    amp: bool = False
    reward_scaling: bool = True
    eval_every: int = 0
    eval_episodes: int = 10

    @property
    def optim(self) -> OptimizerConfig:
        """The optimizer's settings."""
        return OptimizerConfig(
            lr=self.lr, anneal_lr=self.anneal_lr, max_grad_norm=self.max_grad_norm, amp=self.amp
        )


@dataclass(frozen=True)
class ImpalaConfig:
    """``algo=impala``: V-trace over whole rollouts, optionally with PPO's clip (APPO)."""

    kind: Literal["impala"] = "impala"
    num_steps: int = 32
    segment_length: int = 16
    batch_rollouts: int = 1
    epochs: int = 4
    num_minibatches: int = 2
    clip_coef: float | None = 0.2
    gamma: float = 0.99
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float | None = None
    vtrace_lambda: float = 1.0
    vf_coef: float = 0.5
    reconstruction_coef: float = 0.0
    ent_coef: float = 0.01
    normalize_advantages: bool = True
    min_advantage_std: float = 0.3
    optimizer: Literal["rmsprop", "adam"] = "adam"
    lr: float = 3e-4
    anneal_lr: bool = True
    rmsprop_alpha: float = 0.99
    rmsprop_eps: float = 0.01
    rmsprop_momentum: float = 0.0
    adam_eps: float = 1e-5
    max_grad_norm: float | None = 0.5
    amp: bool = False
    reward_scaling: bool = True
    max_policy_lag: int = 100
    eval_every: int = 0
    eval_episodes: int = 10

    @property
    def optim(self) -> OptimizerConfig:
        """The optimizer's settings (Adam's; RMSProp's own are the ``rmsprop_*`` fields)."""
        return OptimizerConfig(
            lr=self.lr,
            anneal_lr=self.anneal_lr,
            max_grad_norm=self.max_grad_norm,
            eps=self.adam_eps,
            amp=self.amp,
        )


@dataclass(frozen=True)
class OfflineConfig:
    """``algo=offline``: supervised training of a DT or BC agent on windows of a dataset."""

    kind: Literal["offline"] = "offline"
    batch_size: int = 64
    context: int | None = None
    lr: float = 1e-4
    weight_decay: float = 1e-4
    adam_eps: float = 1e-8
    warmup_updates: int = 10000
    anneal_lr: bool = False
    max_grad_norm: float | None = 0.25
    amp: bool = False
    log_every: int = 100
    return_scale: float | None = None
    top_fraction: float = 1.0
    eval_every: int = 5000
    eval_episodes: int = 10
    eval_targets: tuple[float, ...] | None = None
    eval_num_targets: int = 3
    eval_deterministic: bool = False
    eval_max_steps: int = 100000
    download: bool = False
    # the DQN Replay reader's options (rltrans.envs.dqn_replay.dqn_replay_episodes)
    dqn_replay: Mapping[str, Any] = field(default_factory=dict)

    @property
    def optim(self) -> OptimizerConfig:
        """The optimizer's settings (the warmup as given; the trainer caps it)."""
        return OptimizerConfig(
            lr=self.lr,
            anneal_lr=self.anneal_lr,
            warmup_updates=self.warmup_updates,
            max_grad_norm=self.max_grad_norm,
            weight_decay=self.weight_decay,
            eps=self.adam_eps,
            amp=self.amp,
        )


AlgoConfig = PPOConfig | ImpalaConfig | OfflineConfig
ALGO_SETTINGS: dict[str, type[AlgoConfig]] = {
    "online": PPOConfig,
    "impala": ImpalaConfig,
    "offline": OfflineConfig,
}


def algo_settings(algo: Mapping[str, Any]) -> AlgoConfig:
    """The typed settings of an ``algo`` section, picked by its ``kind``. Raises ValueError
    for an unknown kind or a key that the kind does not have."""
    kind = algo.get("kind", "online")
    if kind not in ALGO_SETTINGS:
        raise ValueError(f"algo.kind={kind!r}; valid kinds: {', '.join(ALGO_SETTINGS)}")
    return settings_of(ALGO_SETTINGS[kind], algo, section="algo")


def settings_of(cls: type, values: Mapping[str, Any], *, section: str) -> Any:
    """``cls(**values)`` with sequences as tuples (mappings are copied); a key that ``cls``
    does not have is a ValueError naming ``section.key`` and the keys it has."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        where = f" (kind {values['kind']!r})" if "kind" in values else ""
        raise ValueError(
            f"{section}.{unknown[0]}: not a key of {cls.__name__}{where}; its keys: "
            f"{', '.join(names)}"
        )
    return cls(**{key: _frozen(value) for key, value in values.items()})


def _frozen(value: Any) -> Any:
    """Lists as tuples and mappings as plain dicts (they pickle), all the way down."""
    if isinstance(value, Mapping):
        return {k: _frozen(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


__all__ = [
    "ADVANTAGE_SCOPES",
    "ALGO_SETTINGS",
    "AlgoConfig",
    "ImpalaConfig",
    "OfflineConfig",
    "OptimizerConfig",
    "PPOConfig",
    "algo_settings",
    "settings_of",
]
