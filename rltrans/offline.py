"""Offline training of return-conditioned policies: ``rltrans.train agent=dt dataset=<id>``.

Reads top to bottom like the online loop in :mod:`rltrans.train`, whose runtime it shares
(run folder, seeding, device, :class:`~rltrans.learner.Learner`, checkpoints, TensorBoard,
progress bar, JSON summary): parse, seed, load the dataset, build, then loop

    sample B windows of K steps -> agent.loss -> AdamW step (warmup, clip) -> log
    every eval_every steps: play every target return at once in ONE vector env of
    targets x eval_episodes sub-envs -> eval/return_target_<R> -> checkpoint

Decision Transformer (Chen et al. 2021) and its BC baseline both train here (agent=dt|bc).
The dataset's statistics (state mean/std, return scale, timestep embedding size) live in the
model's buffers and in the checkpoint's ``agent_kwargs``, so a checkpoint rebuilds its model
alone (``rltrans.load_policy``, ``python -m rltrans.evaluate``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rltrans.buffers.trajectory import TrajectoryBuffer
from rltrans.checkpoint import (
    CheckpointManager,
    describe,
    restore_rng_state,
    rng_state,
    space_to_dict,
)
from rltrans.config import ConfigError, to_container
from rltrans.evaluate import TargetResult, evaluate_targets
from rltrans.learner import Learner, NonFiniteLossError
from rltrans.logging import MetricLogger, ProgressBar
from rltrans.policy import spaces_payload
from rltrans.train import prepare_run_dir, seed_everything, select_device

__all__ = ["derive_targets", "eval_metrics", "train_offline"]

EVAL_SEED_OFFSET = 10_000  # evaluation episodes start from other seeds than any training use
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


def _window_length(cfg: DictConfig) -> int:
    """K: algo.context, else the agent's own context (DT) or history (BC)."""
    from rltrans.registry import agent_class

    cls = agent_class(cfg.agent)
    if not callable(getattr(cls, "load_stats", None)):
        raise ConfigError(
            f"algo=offline trains return-conditioned agents (agent=dt or agent=bc); "
            f"agent.kind={cfg.agent.get('kind')!r} is not one (it has no load_stats)"
        )
    k = cfg.algo.context or cfg.agent.get("context") or cfg.agent.get("history")
    if not k or k < 1:
        raise ConfigError(f"window length K={k!r}; set algo.context to a positive integer")
    return int(k)


def _targets(cfg: DictConfig, returns: np.ndarray) -> list[float]:
    """algo.eval_targets as floats, or targets derived from the dataset's returns."""
    given = cfg.algo.eval_targets
    if given is None:
        return derive_targets(returns, cfg.algo.eval_num_targets)
    values = list(given) if OmegaConf.is_list(given) else [given]
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise ConfigError(
            f"algo.eval_targets={given!r}; valid: null, a number, or a list like [100, 500]"
        ) from None


def _eval_env_config(
    cfg: DictConfig, dataset: Any, num_envs: int, required: bool
) -> dict[str, Any] | None:
    """env=dataset -> the dataset's own evaluation env as a kind: gym config; others as given.

    None when the dataset records no env and no evaluation is asked for.
    """
    from rltrans.envs.offline import env_config_from_spec

    if cfg.env.kind != "dataset":
        return {**to_container(cfg.env), "num_envs": num_envs}
    if dataset.env_spec is None:
        if not required:
            return None
        raise ConfigError(
            f"dataset {dataset.name!r} records no environment; choose one with env=gym "
            f"env.id=<Gymnasium id>, or algo.eval_episodes=0 to train without evaluation"
        )
    try:
        return env_config_from_spec(dataset.env_spec, num_envs)
    except ValueError as err:
        raise ConfigError(f"dataset {dataset.name!r}: {err}") from None


def _check_env_spaces(envs: Any, buffer: TrajectoryBuffer, dataset_id: str) -> None:
    """Clear error when the evaluation env's spaces differ from the dataset's."""
    pairs = (
        ("observation space", buffer.observation_space, envs.single_observation_space),
        ("action space", buffer.action_space, envs.single_action_space),
    )
    for what, data_space, env_space in pairs:
        ours, theirs = space_to_dict(data_space), space_to_dict(env_space)
        if ours != theirs:
            raise ConfigError(
                f"dataset {dataset_id!r} has {what} {describe(ours)} but the evaluation env "
                f"has {describe(theirs)}; evaluate in the dataset's own env (env=dataset, the "
                f"default of agent=dt|bc) or an env with the same spaces"
            )


def _dataset_info(cfg: DictConfig, dataset: Any, kind: str) -> dict[str, Any]:
    returns = dataset.returns()
    return {
        "id": str(cfg.dataset),
        "kind": kind,
        "episodes": len(dataset),
        "steps": int(dataset.num_steps),
        "min_return": float(returns.min()),
        "mean_return": float(returns.mean()),
        "max_return": float(returns.max()),
    }


def _load(cfg: DictConfig) -> tuple[Any, str]:
    """The dataset cfg.dataset names, and its resolved kind."""
    from rltrans.envs.offline import DATASET_KINDS, detect_dataset_kind, load_dataset

    if cfg.dataset is None:
        raise ConfigError(
            "algo=offline (agent=dt|bc) needs dataset=<Minari id namespace/name-vN or d4rl-atari "
            "id such as pong-mixed-v0>; write one with python -m rltrans.collect"
        )
    kind = cfg.dataset_kind
    if kind not in DATASET_KINDS:
        raise ConfigError(f"dataset_kind={kind!r}; valid: {', '.join(DATASET_KINDS)}")
    if kind == "auto":
        kind = detect_dataset_kind(str(cfg.dataset))
    try:
        dataset = load_dataset(
            str(cfg.dataset),
            kind,
            download=cfg.algo.download,
            dqn_replay=to_container(cfg.algo.dqn_replay),
            progress=cfg.progress,
        )
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    return dataset, kind


def _payload(run: dict[str, Any], step: int, sampler: np.random.Generator) -> dict[str, Any]:
    """Everything a resume, ``load_policy`` or ``rltrans.evaluate`` needs (weights_only-safe)."""
    buffer, agent = run["buffer"], run["agent"]
    return {
        "model": agent.state_dict(),
        "learner": run["learner"].state_dict(),
        "global_step": step,
        "update": step,
        "rng": rng_state(),
        "sampler_rng": json.dumps(sampler.bit_generator.state),  # ints too wide for tensors
        "config": to_container(run["cfg"]),
        "observation_space": space_to_dict(buffer.observation_space),
        "action_space": space_to_dict(buffer.action_space),
        **spaces_payload(buffer.observation_space, buffer.action_space),
        "agent_kwargs": {"stats": buffer.stats()},
        "dataset": run["dataset_info"],
        "eval_targets": run["targets"],
    }


def _resume(manager: CheckpointManager, run: dict[str, Any], sampler: np.random.Generator) -> int:
    """Restore weights, optimizer, schedule, RNGs; returns the gradient step reached."""
    payload = manager.load_latest()
    if payload is None:
        raise ConfigError(f"resume=true but no checkpoint in {manager.directory}")
    saved = payload.get("dataset", {}).get("id")
    if saved != run["dataset_info"]["id"]:
        raise ConfigError(
            f"resume=true: {manager.directory} was trained on dataset {saved!r}, "
            f"not {run['dataset_info']['id']!r}"
        )
    run["agent"].load_state_dict(payload["model"])
    run["learner"].load_state_dict(payload["learner"])
    restore_rng_state(payload["rng"])
    sampler.bit_generator.state = json.loads(payload["sampler_rng"])
    return int(payload["global_step"])


def train_offline(cfg: DictConfig) -> dict[str, Any]:
    """DT/BC on a fixed dataset for ``train_steps`` gradient steps; returns the final summary."""
    from rltrans.envs import make_env

    algo = cfg.algo
    context = _window_length(cfg)
    dataset, kind = _load(cfg)
    agent_name = str(cfg.agent.kind)
    run_dir = prepare_run_dir(cfg, name=f"{str(cfg.dataset).replace('/', '_')}-{agent_name}")
    device = select_device(cfg.device)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)

    # Data -> K-step windows; statistics computed once, stored in the model and checkpoint.
    buffer = TrajectoryBuffer(
        dataset,
        context,
        return_scale=algo.return_scale,
        max_timestep=cfg.agent.get("max_timestep"),
        top_fraction=algo.top_fraction,
        seed=cfg.seed,
    )
    targets = _targets(cfg, dataset.returns())
    num_eval = len(targets) * algo.eval_episodes
    env_cfg = _eval_env_config(cfg, dataset, max(num_eval, 1), required=num_eval > 0)
    if env_cfg is not None:
        with open_dict(cfg):
            cfg.env = env_cfg  # the resolved config records the env evaluate will rebuild
    envs = None
    if num_eval > 0:
        # ONE vector env for every evaluation: env i plays target i // eval_episodes.
        envs = make_env(env_cfg, seed=cfg.seed + EVAL_SEED_OFFSET, device=device, training=False)
        try:
            _check_env_spaces(envs, buffer, str(cfg.dataset))
        except ConfigError:
            envs.close()
            raise

    from rltrans.registry import build_agent

    agent = build_agent(
        to_container(cfg.agent),
        buffer.observation_space,
        buffer.action_space,
        stats=buffer.stats(),
    ).to(device)
    train_steps = int(cfg.train_steps)
    learner = Learner(
        agent,
        lr=algo.lr,
        total_updates=train_steps,
        anneal_lr=algo.anneal_lr,
        warmup_updates=min(int(algo.warmup_updates), int(WARMUP_CAP * train_steps)),
        max_grad_norm=algo.max_grad_norm,
        weight_decay=algo.weight_decay,
        eps=algo.adam_eps,
        amp=algo.amp,
    )
    run = {"cfg": cfg, "agent": agent, "learner": learner, "buffer": buffer, "targets": targets}
    run["dataset_info"] = _dataset_info(cfg, dataset, kind)
    sampler = np.random.default_rng(cfg.seed)  # window sampling, saved in checkpoints
    manager = CheckpointManager(run_dir / "checkpoints", keep_last=cfg.keep_checkpoints)
    step = _resume(manager, run, sampler) if cfg.resume else 0
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)

    logger = MetricLogger(run_dir, use_tensorboard=cfg.tensorboard)
    bar = ProgressBar(train_steps, desc="train", unit="grad step") if cfg.progress else None
    if bar is not None:
        bar.update(step)
    results: list[TargetResult] = []
    totals: dict[str, torch.Tensor] = {}
    count, sample_s, learn_s = 0, 0.0, 0.0
    start, start_step = time.perf_counter(), step
    timing = {"train_s": 0.0, "eval_s": 0.0}  # totals, for the summary
    status = "finished"

    def evaluate_and_save() -> None:
        nonlocal results
        t_eval = time.perf_counter()
        if envs is not None:
            results = evaluate_targets(
                agent,
                envs,
                targets,
                algo.eval_episodes,
                seed=cfg.seed + EVAL_SEED_OFFSET,
                deterministic=algo.eval_deterministic,
                max_steps=algo.eval_max_steps,
            )
            logger.log(step, eval_metrics(results))
        manager.save(step, _payload(run, step, sampler))
        timing["eval_s"] += time.perf_counter() - t_eval

    agent.train()
    try:
        while step < train_steps:
            t0 = time.perf_counter()
            batch = buffer.sample(algo.batch_size, sampler, device=device)  # (B, K, ...)
            t1 = time.perf_counter()
            with learner.autocast():
                loss, metrics = agent.loss(batch)
            metrics["grad_norm"] = learner.step(loss)
            learner.end_update()  # the lr schedule counts gradient steps
            learn_s += time.perf_counter() - t1
            sample_s += t1 - t0
            timing["train_s"] += time.perf_counter() - t0
            for k, v in metrics.items():  # 0-d tensors: no host sync per step
                totals[k] = totals.get(k, 0.0) + v.detach().float()
            count += 1
            step += 1
            if step % algo.log_every == 0 or step == train_steps:
                sps = (step - start_step) / (time.perf_counter() - start)
                logger.log(
                    step,
                    {
                        **{f"losses/{k}": v / count for k, v in totals.items()},
                        "charts/lr": learner.lr,
                        "charts/SPS": sps,
                        "perf/sample_ms": 1e3 * sample_s / count,
                        "perf/learn_ms": 1e3 * learn_s / count,
                    },
                )
                if bar is not None:
                    bar.update(0, loss=logger.summary().get("losses/action"))
                totals, count, sample_s, learn_s = {}, 0, 0.0, 0.0
            if (algo.eval_every and step % algo.eval_every == 0) or step == train_steps:
                evaluate_and_save()
                if bar is not None and results:
                    bar.update(0, ret=eval_metrics(results)["eval/return_mean"])
            if bar is not None:
                bar.update(1)
        if step == start_step:  # nothing left to train (resumed at the end): evaluate once
            evaluate_and_save()
    except NonFiniteLossError as err:
        status = "stopped"
        print(
            f"training stopped at step {step}: {err}. Last good checkpoint: {manager.latest()}",
            file=sys.stderr,
        )
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        if envs is not None:
            envs.close()
    timing["wall_s"] = time.perf_counter() - start
    run["step"] = step
    return _summary(run, status, run_dir, step - start_step, results, timing, logger, manager)


def _summary(
    run: dict[str, Any],
    status: str,
    run_dir: Any,
    trained: int,
    results: list[TargetResult],
    timing: dict[str, float],
    logger: MetricLogger,
    manager: CheckpointManager,
) -> dict[str, Any]:
    """The final JSON line: achieved return per target next to the data's returns."""
    latest = logger.summary()
    summary: dict[str, Any] = {
        "status": status,
        "run_dir": str(run_dir),
        "dataset": run["dataset_info"],
        "train_steps": run["step"],  # gradient steps, resumed ones included
        "loss": latest.get("losses/action"),
        "steps_per_s": trained / max(1e-9, timing["train_s"]),  # training only
        "eval_s": timing["eval_s"],
        "wall_s": timing["wall_s"],
        "eval_targets": run["targets"],
        "eval_episodes_per_target": int(run["cfg"].algo.eval_episodes),
        "checkpoint": str(manager.latest()) if manager.latest() else None,
    }
    if results:
        summary["return_by_target"] = {f"{r.target:g}": float(np.mean(r.returns)) for r in results}
        summary["eval_mean_return"] = eval_metrics(results)["eval/return_mean"]
    return summary
