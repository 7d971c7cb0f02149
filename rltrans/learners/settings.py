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

from rltrans.limits import MAX_ENVS, MAX_EPISODES, MAX_LENGTH

AdvantageScope = Literal["minibatch", "rollout"]
ADVANTAGE_SCOPES: tuple[str, ...] = get_args(AdvantageScope)


@dataclass(frozen=True)
class Knob:
    """What a settings field says of itself besides its type and default: its one-line help
    (the YAML comment), its range, and the help of a mapping's items."""

    help: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # the bound itself is invalid (lr > 0)
    open_high: bool = False
    items: Mapping[str, str] = field(default_factory=dict)
    nonempty: bool = False  # a string field: '' is invalid (a path that would mean "here")


def knob(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    items: Mapping[str, str] | None = None,
    nonempty: bool = False,
) -> Any:
    """A settings field defined once: its default, help and range (its type is the field's
    annotation). The algo YAML files and the config checks are made from these."""
    info = Knob(help, low, high, open_low, open_high, dict(items or {}), nonempty)
    if isinstance(default, Mapping):  # a mutable default: a fresh copy per instance
        return field(default_factory=lambda: dict(default), metadata={KNOB: info})
    return field(default=default, metadata={KNOB: info})


def knob_of(f: dataclasses.Field) -> Knob:
    """A settings field's :class:`Knob` (KeyError for a field not made by :func:`knob`)."""
    return f.metadata[KNOB]


KNOB = "rltrans.knob"
AMP = "bfloat16 autocast on CUDA (ignored on CPU)"
RECONSTRUCTION = (
    "auxiliary loss decoding each step's observation from the backbone output (Memory Gym, "
    "Pleines et al. 2024), times this; logged unweighted as losses/reconstruction; 0 = off "
    "(no decoder is built)"
)
EVAL_EPISODES = (
    "deterministic (mode action) episodes per evaluation, on min(this, env.num_envs) envs of "
    "their own (training=False, seed + 10000)"
)


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

    kind: Literal["online"] = knob("online", "online (PPO) | offline (DT/BC)")
    num_steps: int = knob(128, "T: rollout length per env and update", low=1, high=MAX_LENGTH)
    segment_length: int = knob(
        16,
        "L: training sequence length (1 = single-step windows); divides num_steps",
        low=1,
        high=MAX_LENGTH,
    )
    epochs: int = knob(4, "passes over each rollout", low=1, high=10_000)
    num_minibatches: int = knob(8, "minibatches per epoch (whole segments)", low=1, high=MAX_ENVS)
    chunk_obs_mb: float | None = knob(
        None,
        "memory saver: a minibatch whose observations as float32 exceed this many MB runs in "
        "the fewest equal parts that fit, summing their gradients (the same step); e.g. 16 on "
        "MiniGrid 84x84x3: peak RSS -160 MB, SPS -18 % at 2 threads; null = one pass",
        low=0.0,
        open_low=True,
    )
    gamma: float = knob(0.99, "discount", low=0.0, high=1.0, open_low=True)
    gae_lambda: float = knob(0.95, "GAE lambda", low=0.0, high=1.0)
    clip_coef: float | None = knob(
        0.2, "policy ratio clip; null = no clipping", low=0.0, open_low=True
    )
    vf_clip_coef: float | None = knob(
        0.2, "value clip around the old value; null = no clipping", low=0.0, open_low=True
    )
    ent_coef: float = knob(0.01, "entropy bonus", low=0.0)
    vf_coef: float = knob(0.5, "value loss weight", low=0.0)
    reconstruction_coef: float = knob(0.0, RECONSTRUCTION, low=0.0)
    normalize_advantages: bool = knob(
        True, "standardise advantages (mean 0, std 1) over advantage_scope"
    )
    advantage_scope: AdvantageScope = knob(
        "minibatch",
        "minibatch (PPO2 baselines, CleanRL) | rollout: one mean and std over the whole "
        "rollout, so minibatches without its rare decisions stay small",
    )
    min_advantage_std: float = knob(
        0.0,
        "with normalize_advantages: divide by max(std, this), so a minibatch with no reward in "
        "it (a long corridor) does not scale its noise up to unit size",
        low=0.0,
    )
    target_kl: float | None = knob(
        None, "stop the epochs early above this approx KL; null = never", low=0.0, open_low=True
    )
    lr: float = knob(3e-4, "Adam learning rate", low=0.0, open_low=True)
    anneal_lr: bool = knob(True, "linear decay to 0 over training")
    max_grad_norm: float | None = knob(
        0.5, "global gradient-norm clip; null = none", low=0.0, open_low=True
    )
    amp: bool = knob(False, AMP)
    reward_scaling: bool = knob(
        True,
        "divide rewards by a running std of the discounted return, or by the largest "
        "|discounted return| so far where that is below 1: value targets O(1), large "
        "(CartPole's) scaled down, small (a few thousandths per step) scaled up to 1",
    )
    eval_every: int = knob(
        0,
        "updates between evaluations (eval/episodic_return, ...); 0 = never. Off by default: "
        "an evaluation costs its episodes' length (T-maze ~12 steps, CartPole up to 500, Atari "
        "up to 27k), so pick it per env, e.g. 25 on the T-maze (< 1 %)",
        low=0,
    )
    eval_episodes: int = knob(10, EVAL_EPISODES, low=0, high=MAX_EPISODES)

    @property
    def optim(self) -> OptimizerConfig:
        """The optimizer's settings."""
        return OptimizerConfig(
            lr=self.lr, anneal_lr=self.anneal_lr, max_grad_norm=self.max_grad_norm, amp=self.amp
        )


@dataclass(frozen=True)
class ImpalaConfig:
    """``algo=impala``: V-trace over whole rollouts, optionally with PPO's clip (APPO)."""

    kind: Literal["impala"] = knob(
        "impala",
        "online (PPO) | offline (DT/BC) | impala (the actor pool: runtime=local|process|ray)",
    )
    num_steps: int = knob(
        32, "T: rollout length per env; V-trace runs over all T steps", low=1, high=MAX_LENGTH
    )
    segment_length: int = knob(
        16,
        "L: training sequence length (gradients flow within a segment); divides num_steps",
        low=1,
        high=MAX_LENGTH,
    )
    batch_rollouts: int = knob(
        1, "B: rollouts per learner step (concatenated along envs)", low=1, high=MAX_ENVS
    )
    epochs: int = knob(
        4,
        "passes over each batch (1 = the paper); each step replays its envs with the current "
        "weights and V-trace corrects for their change",
        low=1,
        high=10_000,
    )
    num_minibatches: int = knob(
        2,
        "gradient steps per pass, on disjoint random sets of envs (whole rollouts)",
        low=1,
        high=MAX_ENVS,
    )
    clip_coef: float | None = knob(
        0.2,
        "PPO's clipped surrogate over pi/mu with V-trace advantages (as APPO); null = the "
        "paper's rho-weighted policy gradient",
        low=0.0,
        open_low=True,
    )
    gamma: float = knob(0.99, "discount", low=0.0, high=1.0, open_low=True)
    rho_bar: float = knob(
        1.0, "V-trace clip of the importance weights in the value targets", low=0.0, open_low=True
    )
    c_bar: float = knob(1.0, "V-trace clip of the trace coefficients c_s", low=0.0, open_low=True)
    pg_rho_bar: float | None = knob(
        None,
        "clip of the policy-gradient importance weights; null = rho_bar (the paper)",
        low=0.0,
        open_low=True,
    )
    vtrace_lambda: float = knob(
        1.0, "lambda: c_s = lambda * min(c_bar, pi/mu) (1 = the paper's V-trace)", low=0.0, high=1.0
    )
    vf_coef: float = knob(0.5, "value loss weight", low=0.0)
    reconstruction_coef: float = knob(0.0, RECONSTRUCTION, low=0.0)
    ent_coef: float = knob(0.01, "entropy bonus", low=0.0)
    normalize_advantages: bool = knob(
        True,
        "standardise the policy-gradient advantages over each minibatch (as PPO does per "
        "minibatch; not in the paper)",
    )
    min_advantage_std: float = knob(
        0.3,
        "with normalize_advantages: divide by max(std, this), so that once every advantage is "
        "near 0 (a solved task) noise is not scaled up to unit size",
        low=0.0,
    )
    optimizer: Literal["rmsprop", "adam"] = knob("adam", "rmsprop (the paper) | adam")
    lr: float = knob(
        3e-4, "learning rate (algo=impala_paper: 4e-3 with rmsprop)", low=0.0, open_low=True
    )
    anneal_lr: bool = knob(True, "linear decay to 0 over training")
    rmsprop_alpha: float = knob(
        0.99, "RMSProp decay (paper: 0.99)", low=0.0, high=1.0, open_high=True
    )
    rmsprop_eps: float = knob(
        0.01,
        "RMSProp epsilon (paper: 0.01; torch adds it outside the square root)",
        low=0.0,
        open_low=True,
    )
    rmsprop_momentum: float = knob(
        0.0, "RMSProp momentum (paper: 0)", low=0.0, high=1.0, open_high=True
    )
    adam_eps: float = knob(1e-5, "Adam epsilon (optimizer=adam)", low=0.0, open_low=True)
    max_grad_norm: float | None = knob(
        0.5, "global gradient-norm clip of the mean loss; null = none", low=0.0, open_low=True
    )
    amp: bool = knob(False, AMP)
    reward_scaling: bool = knob(
        True,
        "as PPO's (a running std of the discounted return, or the largest |return| where below "
        "1), per actor, applied by the learner process (in checkpoints)",
    )
    max_policy_lag: int = knob(
        100,
        "drop (and count) rollouts acted by weights older than the learner's version minus "
        "this (runtime=local has lag 0)",
        low=0,
    )
    eval_every: int = knob(
        0,
        "learner steps between evaluations of the learner's own agent (rank 0 under "
        "torchrun); 0 = never. Off by default: the learner waits for it, and its cost is its "
        "episodes' length (CartPole up to 500 steps, Atari up to 27k)",
        low=0,
    )
    eval_episodes: int = knob(10, EVAL_EPISODES, low=0, high=MAX_EPISODES)

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

    kind: Literal["offline"] = knob("offline", "online (PPO) | offline (DT/BC)")
    batch_size: int = knob(64, "windows per gradient step (paper: 64)", low=1, high=MAX_ENVS)
    context: int | None = knob(
        None,
        "K: window length in steps; null = the agent's (dt: context, bc: history)",
        low=1,
        high=MAX_LENGTH,
    )
    lr: float = knob(1e-4, "AdamW learning rate (paper: 1e-4; Atari: 6e-4)", low=0.0, open_low=True)
    weight_decay: float = knob(
        1e-4,
        "AdamW weight decay (paper: 1e-4), applied to all parameters (the DT code exempts "
        "biases, LayerNorms and embeddings; at 1e-4 this is minor)",
        low=0.0,
    )
    adam_eps: float = knob(
        1e-8, "AdamW epsilon (PyTorch's default, as the DT code)", low=0.0, open_low=True
    )
    warmup_updates: int = knob(
        10000,
        "linear lr warmup over this many steps (paper: 1e4), capped at 10% of train_steps so "
        "that short runs still spend most steps at full lr",
        low=0,
    )
    anneal_lr: bool = knob(
        False, "true = decay the lr linearly to 0 (paper: constant after warmup)"
    )
    max_grad_norm: float | None = knob(
        0.25, "global gradient-norm clip (paper: 0.25); null = none", low=0.0, open_low=True
    )
    amp: bool = knob(False, AMP)
    log_every: int = knob(100, "gradient steps between logged loss averages", low=1)
    return_scale: float | None = knob(
        None,
        "returns-to-go are divided by it; null = the largest |episode return| in the data (the "
        "paper fixes 1000 for MuJoCo locomotion)",
        low=0.0,
        open_low=True,
    )
    top_fraction: float = knob(
        1.0,
        "train on the best-return episodes covering this fraction of the steps (0.1 = the "
        "paper's 10% BC); statistics always use every episode",
        low=0.0,
        high=1.0,
        open_low=True,
    )
    eval_every: int = knob(
        5000,
        "gradient steps between evaluations, each followed by a checkpoint; 0 = evaluate only "
        "at the end",
        low=0,
    )
    save_every: int = knob(
        1000,
        "gradient steps between checkpoints besides those after evaluations, so a killed run "
        "loses at most this many; 0 = only after evaluations and at the end",
        low=0,
    )
    eval_episodes: int = knob(
        10,
        "episodes per target return; 0 = no evaluation (checkpoints as without it)",
        low=0,
        high=MAX_EPISODES,
    )
    eval_targets: tuple[float, ...] | None = knob(
        None,
        "target returns, e.g. [100, 300, 500]; null = eval_num_targets values evenly spaced "
        "above the dataset's worst return up to its best one",
    )
    eval_num_targets: int = knob(
        3, "how many targets to derive when eval_targets is null", low=1, high=1000
    )
    eval_deterministic: bool = knob(
        False,
        "false = sample Discrete actions from the predicted distribution (DT's Atari code); "
        "true = argmax. Box actions are always the regressed mean",
    )
    eval_max_steps: int = knob(100000, "safety limit on vector steps per evaluation", low=1)
    download: bool = knob(
        False, "Minari: fetch a dataset that is not local (needs network, minari[hf])"
    )
    # The DQN Replay reader's options: their choices are the reader's own
    # (rltrans.envs.dqn_replay, which the learners do not import; rltrans.config.keys).
    dqn_replay: Mapping[str, Any] = knob(
        {
            "root": None,
            "check_size": True,
            "padding": "drop",
            "order": "index",
            "partial": "keep",
            "frame_stack": 4,
        },
        "reader options for DQN Replay data (rltrans.envs.dqn_replay.dqn_replay_episodes)",
        items={
            "root": "folder holding <Game>/<run>/...; null = $D4RL_DATASET_DIR or ~/.d4rl/datasets",
            "check_size": "require 1,000,000 rows per checkpoint (false for small files)",
            "padding": "drop | keep   Dopamine's 3 zero rows before each episode",
            "order": "index | chronological   (chronological undoes the ring-buffer rotation)",
            "partial": "keep | drop   episodes cut by a checkpoint boundary",
            "frame_stack": "frames per observation (stacked at sampling time, zero-padded)",
        },
    )

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
    "Knob",
    "OfflineConfig",
    "OptimizerConfig",
    "PPOConfig",
    "algo_settings",
    "knob",
    "knob_of",
    "settings_of",
]
