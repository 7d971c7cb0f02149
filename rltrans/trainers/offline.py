"""Offline training of return-conditioned policies: ``rltrans.train agent=dt dataset=<id>``.

Decision Transformer (Chen et al. 2021) and its BC baseline both train here, on the trainers'
shared skeleton (:class:`rltrans.trainers.skeleton.Trainer`), as PPO: open the run, load the
dataset, build, then loop

    sample B windows of K steps -> agent.loss -> AdamW step (warmup, clip) -> log
    every eval_every steps: play every target return at once in ONE vector env of
    targets x eval_episodes sub-envs -> eval/return_target_<R> -> checkpoint
    every save_every steps in between: checkpoint

The dataset's statistics (state mean/std, return scale, timestep embedding size) live in the
model's buffers and in the checkpoint's ``agent_kwargs``, so a checkpoint rebuilds its model
alone (``rltrans.load_policy``, ``python -m rltrans.evaluate``).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from rltrans.accel.run_speed import RunSpeed
from rltrans.buffers.trajectory import TrajectoryBuffer
from rltrans.config import ConfigError, checked_file_config, refuse_env_code, to_container
from rltrans.config.errors import first_line
from rltrans.config.keys import MAX_LENGTH, MAX_SPACE_SIZE, MAX_STEPS
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_resources, wrapper_problems
from rltrans.envs import make_env
from rltrans.envs.gym_vec import close_envs
from rltrans.envs.offline import (
    DATASET_KINDS,
    DatasetError,
    OfflineDataset,
    detect_dataset_kind,
    env_config_from_spec,
    load_dataset,
    normalized_by_target,
)
from rltrans.learners import Learner
from rltrans.learners.settings import OfflineConfig
from rltrans.registry import agent_entry, build_agent
from rltrans.run.context import Run
from rltrans.runtime.episodes import MaxStepsError
from rltrans.runtime.evaluation import TargetResult, evaluate_targets
from rltrans.spaces import check_same_spaces
from rltrans.trainers.common import (
    EVAL_SEED_OFFSET,
    Callbacks,
    TrainerState,
)
from rltrans.trainers.skeleton import Trainer

__all__ = ["derive_targets", "eval_metrics", "train_offline"]

WARMUP_CAP = 0.1  # warmup is at most this fraction of train_steps (see configs/algo/offline.yaml)


def derive_targets(returns: np.ndarray, count: int) -> list[float]:
    """``count`` targets evenly spaced above the worst episode return, up to the best one.

    The best return is the paper's main target (Chen et al. 2021, section 5); the spread
    below it shows whether achieved return follows the target (their Figure 4).

    Example:
        >>> derive_targets(np.array([10.0, 20.0, 500.0]), 3)
        [173.33, 336.67, 500.0]
    """
    if count < 1:
        raise ConfigError(f"algo.eval_num_targets={count}; need at least 1")
    lo, hi = float(returns.min()), float(returns.max())
    values = np.linspace(lo, hi, count + 1)[1:] if hi > lo else np.array([hi])
    return sorted({round(float(v), 2) for v in values})


def eval_metrics(results: list[TargetResult]) -> dict[str, float]:
    """``eval/return_target_<R>`` per target plus their mean, for TensorBoard."""
    means = {f"eval/return_target_{r.target:g}": float(np.mean(r.returns)) for r in results}
    lengths = [n for r in results for n in r.lengths]
    return {
        **means,
        "eval/return_mean": float(np.mean(list(means.values()))),
        "eval/length_mean": float(np.mean(lengths)),
    }


class SamplerState:
    """The window sampler's generator, checkpointed as JSON (its ints are too wide for
    tensors)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def state_dict(self) -> str:
        """The bit generator's state."""
        return json.dumps(self.rng.bit_generator.state)

    def load_state_dict(self, state: str) -> None:
        """Restore the bit generator's state."""
        self.rng.bit_generator.state = json.loads(state)


def window_length(plan: RunPlan) -> int:
    """K: algo.context, else the agent's own context (DT) or history (BC)."""
    agent = plan.agent.options
    if not agent_entry(agent).return_conditioned:
        raise ConfigError(
            f"algo=offline trains return-conditioned agents (agent=dt or agent=bc); "
            f"agent.kind={agent.get('kind')!r} is not one"
        )
    k = plan.algo.context or agent.get("context") or agent.get("history")
    if not k or k < 1:
        raise ConfigError(f"window length K={k!r}; set algo.context to a positive integer")
    return int(k)


def eval_targets(algo: OfflineConfig, returns: np.ndarray) -> list[float]:
    """algo.eval_targets as floats, or targets derived from the dataset's returns."""
    given = algo.eval_targets
    if given is None:
        return derive_targets(returns, algo.eval_num_targets)
    return [float(v) for v in (given if isinstance(given, tuple | list) else [given])]


def eval_env_config(
    plan: RunPlan, dataset: OfflineDataset, num_envs: int, required: bool
) -> dict[str, Any] | None:
    """env=dataset -> the dataset's own evaluation env as a kind: gym config; others as given.

    None when the dataset records no env and no evaluation is asked for.
    """
    if plan.env.kind != "dataset":
        return plan.env.to_dict(num_envs=num_envs)
    if dataset.env_spec is None:
        if not required:
            return None
        raise ConfigError(
            f"dataset {dataset.name!r} records no environment; choose one with env=gym "
            f"env.id=<Gymnasium id>, or algo.eval_episodes=0 to train without evaluation"
        )
    try:
        env_cfg = env_config_from_spec(dataset.env_spec, num_envs)
    except ValueError as err:
        raise ConfigError(f"dataset {dataset.name!r}: {err}") from None
    # The metadata is a file like any other: the env it names is checked before anything of
    # it is imported, exactly as a checkpoint's env is.
    source = f"the environment spec of dataset {dataset.name!r} (its metadata)"
    checked = checked_file_config({**plan.to_dict(), "env": env_cfg}, source)
    refuse_env_code(env_cfg, source, plan.run.trust_env_code)
    return to_container(checked.env)


def check_dataset_wrappers(dataset: OfflineDataset) -> None:
    """Refuse sizes in the wrappers of a dataset's env spec (FrameStackObservation's
    stack_size also stacks the dataset's rows) before the data or the env is built."""
    spec = dataset.env_spec
    wrappers = [{"kwargs": dict(w.kwargs or {})} for w in spec.additional_wrappers] if spec else []
    problems = wrapper_problems(wrappers, MAX_LENGTH, MAX_STEPS, MAX_SPACE_SIZE)
    if problems:
        raise ConfigError(f"dataset {dataset.name!r} (its metadata): {problems[0]}")


def load(plan: RunPlan) -> tuple[OfflineDataset, dict[str, Any]]:
    """The dataset ``dataset=`` names, and its description for checkpoints and the summary."""
    run, algo = plan.run, plan.algo
    name = run.dataset
    if name is None:
        raise ConfigError(
            "algo=offline (agent=dt|bc) needs dataset=<Minari id namespace/name-vN or d4rl-atari "
            "id such as pong-mixed-v0>; write one with python -m rltrans.collect"
        )
    kind = run.dataset_kind
    if kind not in DATASET_KINDS:
        raise ConfigError(f"dataset_kind={kind!r}; valid: {', '.join(DATASET_KINDS)}")
    if kind == "auto":
        kind = detect_dataset_kind(name)
    try:
        dataset = load_dataset(
            name,
            kind,
            download=algo.download,
            dqn_replay=dict(algo.dqn_replay),
            progress=run.progress,
        )
        reference = dataset.reference_scores()  # D4RL's returns, when the metadata has them
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    except ConfigError:
        raise
    except DatasetError as err:  # a value or size no reader may use: the message names it
        raise ConfigError(f"dataset {name!r}: {err}") from None
    except Exception as err:  # bad bytes of any kind in the user's files
        # A dataset is read from files like a checkpoint: whatever its readers (json, h5py,
        # gzip, NumPy) raise on malformed or hostile bytes is one error line naming it.
        first = first_line(err)
        raise ConfigError(
            f"dataset {name!r} cannot be read ({type(err).__name__}: {first})"
        ) from None
    check_dataset_wrappers(dataset)
    returns = dataset.returns()
    info = {
        "id": name,
        "kind": kind,
        "episodes": len(dataset),
        "steps": int(dataset.num_steps),
        "min_return": float(returns.min()),
        "mean_return": float(returns.mean()),
        "max_return": float(returns.max()),
    }
    if reference is not None:  # D4RL-style data: scores are normalised against these
        info["ref_min_score"], info["ref_max_score"] = reference
    return dataset, info


class OfflineTrainer(Trainer):
    """DT / BC on the skeleton of :class:`rltrans.trainers.skeleton.Trainer`; an update is one
    gradient step."""

    unit = "grad step"

    def __init__(self, plan: RunPlan, callbacks: Callbacks | None = None) -> None:
        super().__init__(plan, callbacks)
        self.envs: Any = None
        self.results: list[TargetResult] = []
        self.totals: dict[str, torch.Tensor] = {}
        self.count, self.sample_s, self.learn_s, self.train_s, self.eval_s = 0, 0.0, 0.0, 0.0, 0.0
        self.saved = False  # whether this update saved (after an evaluation or on its own)

    def name(self) -> str:
        """<dataset>-<agent kind>."""
        window_length(self.plan)  # an agent that is not return-conditioned: refused here
        return f"{str(self.plan.run.dataset).replace('/', '_')}-{self.plan.agent.kind}"

    def build(self, run: Run) -> None:
        """Dataset windows, evaluation env, agent, learner and the resumed state."""
        plan, device, algo = self.plan, run.device, self.plan.algo
        settings = plan.run
        with run.building("dataset"):
            dataset, self.data_info = load(plan)  # on resume: the saved config's dataset
            # Data -> K-step windows; statistics computed once, kept in model and checkpoint.
            self.buffer = TrajectoryBuffer(
                dataset,
                window_length(plan),
                return_scale=algo.return_scale,
                max_timestep=plan.agent.options.get("max_timestep"),
                top_fraction=algo.top_fraction,
                seed=settings.seed,
            )
        self.spaces = (self.buffer.observation_space, self.buffer.action_space)
        self.targets = eval_targets(algo, dataset.returns())
        env_cfg = self._eval_env(run, dataset)
        with run.building("agent"):
            # The heads and encoders the spaces size.
            check_resources(plan.config, spaces=self.spaces)
            stats = self.buffer.stats()
            self.agent = build_agent(plan.agent.to_dict(), *self.spaces, stats=stats)
            self.agent.to(device)
        self.total = train_steps = settings.train_steps
        # compile: the agent's loss (forward and backward) through torch.compile; auto decides
        # from the first 20 gradient steps (an "update" is one step here).
        self.speed = RunSpeed(plan.speed, device, train_steps, measure=20)
        self.accel = accel = self.speed.accel
        optim = algo.optim
        warmup = min(optim.warmup_updates, int(WARMUP_CAP * train_steps))
        self.learner = Learner(
            self.agent,
            replace(optim, warmup_updates=warmup),
            total_updates=train_steps,
            accel=accel,
        )
        self.progress = run.resume(self.agent, self.learner, self.spaces)
        self.sampler = SamplerState(np.random.default_rng(settings.seed))  # window sampling
        self.state = TrainerState(sampler_rng=self.sampler, **self.speed.parts())
        self.state.load_state_dict(run.resumed_payload or {}, source=run.resumed_source)
        self.speed.start(train_steps - self.progress)
        self.extra = {"agent_kwargs": {"stats": stats}, "dataset": self.data_info}
        self.extra.update(eval_targets=self.targets, eval_env=env_cfg)
        self.agent.train()

    def _eval_env(self, run: Run, dataset: OfflineDataset) -> dict[str, Any]:
        """The evaluation env's config (what checkpoints record); builds the env itself
        where there is evaluation: ONE vector env, env i plays target i // eval_episodes."""
        algo = self.plan.algo
        num_eval = len(self.targets) * algo.eval_episodes
        with run.building("env"):
            # The config keeps what was asked (env=dataset); checkpoints record the env it
            # resolved to, which rltrans.evaluate and rltrans.collect rebuild.
            env_cfg = eval_env_config(self.plan, dataset, max(num_eval, 1), num_eval > 0)
            if num_eval > 0:
                seed = self.plan.run.seed + EVAL_SEED_OFFSET
                self.envs = make_env(env_cfg, seed=seed, device=run.device, training=False)
                env_spaces = (self.envs.single_observation_space, self.envs.single_action_space)
                check_same_spaces(
                    self.spaces, env_spaces,
                    expected_label=f"dataset {self.plan.run.dataset!r} has",
                    actual_label="the evaluation env has",
                )  # fmt: skip
        return env_cfg

    def update(self) -> None:
        """One gradient step on B sampled windows; log every ``algo.log_every`` steps,
        evaluate and checkpoint every ``algo.eval_every`` steps and at the end, checkpoint
        every ``algo.save_every`` steps."""
        algo, accel, learner = self.plan.algo, self.accel, self.learner
        t0 = time.perf_counter()
        batch = self.buffer.sample(algo.batch_size, self.sampler.rng, device=self.run.device)
        t1 = time.perf_counter()
        with accel.step():
            loss_fn = accel.program(self.agent.loss)
            with learner.autocast():
                loss, metrics = loss_fn(batch)
            metrics["grad_norm"] = learner.step(loss)
        learner.end_update()  # the lr schedule counts gradient steps
        t2 = time.perf_counter()
        self.speed.after_update(t2 - t1)
        self.sample_s, self.learn_s = self.sample_s + t1 - t0, self.learn_s + t2 - t1
        self.train_s += t2 - t0
        for k, v in metrics.items():  # 0-d tensors: no host sync per step
            self.totals[k] = self.totals.get(k, 0.0) + v.detach().float()
        self.count, self.progress = self.count + 1, self.progress + 1
        if self.progress % algo.log_every == 0 or self.progress == self.total:
            self._log()
        every, save = algo.eval_every, algo.save_every  # evaluations save; at the end too
        evaluating = bool(every and self.progress % every == 0) or self.finished()
        self.saved = evaluating or bool(save and self.progress % save == 0)
        if evaluating:
            self._evaluate_and_save()
        elif self.saved:  # a killed run loses at most save_every steps
            self._save()
        if self.bar is not None:
            self.bar.update(1)

    def _log(self) -> None:
        count = self.count
        self.logger.log(
            self.progress,
            {
                **{f"losses/{k}": v / count for k, v in self.totals.items()},
                "charts/lr": self.learner.lr,
                "charts/SPS": self.elapsed_rate(),
                "perf/sample_ms": 1e3 * self.sample_s / count,
                "perf/learn_ms": 1e3 * self.learn_s / count,
            },
        )
        if self.bar is not None:
            self.bar.update(0, loss=self.logger.summary().get("losses/action"))
        self.totals, self.count, self.sample_s, self.learn_s = {}, 0, 0.0, 0.0

    def payload(self) -> dict[str, Any]:
        """Weights, learner, RNG states, the data's statistics and the trainer state."""
        self.state.update = self.progress
        extra = {**self.extra, **self.state.state_dict()}
        return self.run.payload(self.progress, self.agent, self.learner, self.spaces, extra)

    def long_update_due(self) -> bool:
        """The next gradient step ends with an evaluation."""
        every, step = self.plan.algo.eval_every, self.progress + 1
        return bool(every and step % every == 0) or step >= self.total

    def _save(self) -> None:
        self.run.save_payload(self.progress, self.payload())

    def _evaluate_and_save(self) -> None:
        """Play every target return (where there is an env), log, checkpoint."""
        algo, start = self.plan.algo, time.perf_counter()
        if self.envs is not None:
            try:
                self.results = evaluate_targets(
                    self.agent, self.envs, self.targets, algo.eval_episodes,
                    seed=self.plan.run.seed + EVAL_SEED_OFFSET, device=self.run.device,
                    deterministic=algo.eval_deterministic, max_steps=algo.eval_max_steps,
                )  # fmt: skip
            except MaxStepsError as err:  # an env whose episodes never end (no time limit)
                raise ConfigError(
                    f"{err} (algo.eval_max_steps): the evaluation env's episodes do not end; "
                    f"give it a time limit or raise algo.eval_max_steps"
                ) from None
            self.logger.log(self.progress, eval_metrics(self.results))
        self._save()
        self.eval_s += time.perf_counter() - start
        if self.bar is not None and self.results:
            self.bar.update(0, ret=eval_metrics(self.results)["eval/return_mean"])

    def checkpoint(self, done: bool, stopping: bool) -> None:
        """Save when stopping at a step that did not save (each evaluation saves its step, and
        so does every ``algo.save_every``-th)."""
        if stopping and not self.saved:
            self._save()

    def begin(self) -> None:
        """A run resumed at its end trains nothing: it evaluates once, for its summary."""
        if self.finished():
            self._evaluate_and_save()

    def close(self, status: str) -> None:
        """Close the evaluation env (after a signal, which may have stopped an evaluation
        mid-step, without awaiting its async workers)."""
        if self.envs is not None:
            close_envs(self.envs, cut_short=status == "interrupted")

    def summary(self, status: str) -> dict[str, Any]:
        """status, dataset, gradient steps, loss, speed, and the return of every target."""
        summary: dict[str, Any] = {
            "status": status,
            "run_dir": str(self.run.dir),
            "dataset": self.data_info,
            "train_steps": self.progress,  # gradient steps, resumed ones included
            "loss": self.logger.summary().get("losses/action"),
            "steps_per_s": (self.progress - self.start_progress) / max(1e-9, self.train_s),
            "eval_s": self.eval_s,
            "wall_s": time.perf_counter() - self.start_time,
            "eval_targets": self.targets,
            "eval_episodes_per_target": self.plan.algo.eval_episodes,
            "checkpoint": self.run.latest_checkpoint(),
        }
        if self.results:
            by_target = {f"{r.target:g}": float(np.mean(r.returns)) for r in self.results}
            summary["return_by_target"] = by_target
            summary["eval_mean_return"] = eval_metrics(self.results)["eval/return_mean"]
            normalized = normalized_by_target(by_target, self.data_info)
            if normalized is not None:
                summary["normalized_score_by_target"] = normalized
        return summary


def train_offline(plan: RunPlan, callbacks: Callbacks | None = None) -> dict[str, Any]:
    """DT/BC on a fixed dataset for ``train_steps`` gradient steps; returns the final summary."""
    return OfflineTrainer(plan, callbacks).train()
