"""Learners: they receive batches and return metrics, knowing no env and no process.

* :class:`~rltrans.learners.base.Learner` — optimizer, schedule, clipping, AMP, all-reduce
  (the offline trainer's learner as it is);
* :class:`~rltrans.learners.ppo.PPOLearner` — PPO's epochs of minibatches;
* :class:`~rltrans.learners.impala.ImpalaLearner` — V-trace steps over batches of rollouts.
"""

from rltrans.learners.base import Learner, NonFiniteLossError, fold_aux
from rltrans.learners.impala import ImpalaLearner
from rltrans.learners.ppo import PPOLearner

__all__ = ["ImpalaLearner", "Learner", "NonFiniteLossError", "PPOLearner", "fold_aux"]
