"""Learners: they receive batches and return metrics, knowing no env and no process.

* :class:`~rltrans.learners.base.Learner` — optimizer, schedule, clipping, AMP, all-reduce
  (the offline trainer's learner as it is);
* :class:`~rltrans.learners.ppo.PPOLearner` — PPO's epochs of minibatches;
* :class:`~rltrans.learners.impala.ImpalaLearner` — V-trace steps over batches of rollouts.

Each takes its settings whole (:mod:`rltrans.learners.settings`: ``OptimizerConfig``,
``PPOConfig``, ``ImpalaConfig``), as the run plan resolved them.
"""

from rltrans.learners.base import Learner, NonFiniteLossError, fold_aux
from rltrans.learners.impala import ImpalaLearner
from rltrans.learners.ppo import PPOLearner
from rltrans.learners.settings import (
    ImpalaConfig,
    OfflineConfig,
    OptimizerConfig,
    PPOConfig,
    algo_settings,
)

__all__ = [
    "ImpalaConfig",
    "ImpalaLearner",
    "Learner",
    "NonFiniteLossError",
    "OfflineConfig",
    "OptimizerConfig",
    "PPOConfig",
    "PPOLearner",
    "algo_settings",
    "fold_aux",
]
