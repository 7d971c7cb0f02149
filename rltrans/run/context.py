"""The run context every trainer shares: device, threads, seeding, the run folder and its
lock, the saved config, the checkpoint payload, resume, the NaN stop and the summary line.

A run folder has one writer at a time (an OS file lock, released by the OS when its process
dies, so a crashed run's folder is simply taken over). A fresh run refuses a folder that
already holds checkpoints unless ``resume=true`` (continue it) or ``overwrite=true`` (start
over). The config a resumed run continues with is settled before the run starts
(:mod:`rltrans.api.resume`, from :func:`rltrans.api.resolve`). Which folders a run may
take, and how it writes in them (never through a link): :mod:`rltrans.run.folder`.

Example (inside a trainer)::

    run = Run.start(plan, name="tmaze-gtrxl")  # a plan's settled config (rltrans.api)
    ...build envs, agent, learner...
    step = run.resume(agent, learner)            # 0 on a fresh run
    run.save(step, agent, learner, spaces, extra={"update": update})
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rltrans import distributed
from rltrans.accel import threads as accel_threads
from rltrans.config import ConfigError
from rltrans.config.errors import first_line
from rltrans.config.frozen import Frozen, thaw
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_threads
from rltrans.config.run_settings import RunSettings
from rltrans.distributed import World
from rltrans.fsutil import StorageError
from rltrans.limits import MAX_SPACE_SIZE
from rltrans.run.checkpoint import (
    CheckpointError,
    CheckpointManager,
    check_finite_weights,
    load_checkpoint,
)
from rltrans.run.folder import (
    CONFIG_FILE,
    LOCK_FILE,
    RUN_ENTRIES,
    RunFolderLock,
    check_claimable,
    check_entries,
    make_run_dir,
    mark,
    missing_parents,
    open_run_dir,
    refuse_links,
    remove_created,
    remove_empty,
    remove_for_overwrite,
    save_config,
)
from rltrans.run.rng import rng_state
from rltrans.run.saved_state import check_saved_state, restore_payload
from rltrans.spaces import check_same_spaces, deserialize_space, serialize_space


def select_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; cuda without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"device={name!r}; valid choices: auto, cpu, cuda, cuda:<index>")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but torch sees no CUDA device; use device=cpu or auto")
    device = torch.device(name)
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.index is not None and device.index >= count:
        raise ConfigError(
            f"device={name}: no such device; torch sees {count} CUDA device(s): "
            f"cuda:0 to cuda:{count - 1}"
        )
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _learner_device(settings: RunSettings, world: World) -> torch.device:
    """``device``; under torchrun a bare ``cuda`` means this process's own GPU."""
    device = select_device(settings.device)
    if world.distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", world.local_rank)
    return device


def set_threads(threads: int | str | None) -> None:
    """Set torch's intra-op threads (:func:`rltrans.accel.threads.set_threads`) once their
    stacks are known to fit this process (ConfigError, before any thread starts)."""
    check_threads(threads)
    accel_threads.set_threads(threads)


def setup(settings: RunSettings) -> torch.device:
    """Device, threads and seeds from a run's ``device``, ``torch_threads`` and ``seed``."""
    device = select_device(settings.device)
    set_threads(settings.torch_threads)
    seed_everything(settings.seed)
    return device


# ----------------------------------------------------------------------------- run folder


@contextlib.contextmanager
def building(what: str) -> Iterator[None]:
    """Turn an error raised while building ``what`` (``env``, ``agent``, ``dataset``) from a
    config into one ConfigError line naming it: an unknown Gymnasium id, a missing optional
    package or a bad argument is the user's to fix (exit 2), not a traceback."""
    try:
        yield
    except ConfigError:
        raise
    except (ValueError, TypeError, ImportError, KeyError, gym.error.Error) as err:
        text = first_line(err)
        raise ConfigError(f"{what}: {text}") from None


@contextlib.contextmanager
def restoring(source: str) -> Iterator[None]:
    """Turn an error raised while restoring a checkpoint's saved state (weights, optimizer,
    RNG, trainer counters) into one CheckpointError naming ``source``: a damaged or edited
    file is the user's to replace, not a traceback."""
    try:
        yield
    except CheckpointError:
        raise
    except (
        KeyError,
        TypeError,
        ValueError,
        RuntimeError,
        IndexError,
        AttributeError,
        OverflowError,
    ) as err:
        text = first_line(err)
        raise CheckpointError(f"{source}: its saved state does not load ({text})") from None


def _not_started(err: BaseException, created: bool) -> None:
    """Raise a full disk's (or read-only folder's) StorageError of a failed start again,
    saying what the start left behind: nothing it created stays."""
    if isinstance(err, StorageError):
        left = "the run folder it created was removed" if created else "nothing was changed"
        raise StorageError(err.errno, f"{err}; the run did not start ({left})") from None


def default_run_dir(name: str, seed: int) -> Path:
    """runs/<name>-s<seed>-<timestamp>-<random>: two runs started in the same second differ."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{name}-s{seed}-{stamp}-{secrets.token_hex(3)}"


class Run:
    """A run folder owned by this process: config, checkpoints, logging destination.

    Use :meth:`start`; ``config`` is then the config the run actually uses (its plan's: for a
    resumed run, the saved one with the allowed changes) with the ``run_dir`` it chose, read-only,
    ``settings`` its top-level keys typed, ``device`` the torch device.
    """

    def __init__(
        self,
        config: Frozen,
        run_dir: Path,
        lock: RunFolderLock | None,
        created: bool = False,
        world: World | None = None,
        dir_fd: int | None = None,
    ) -> None:
        """``dir_fd``: a descriptor of ``run_dir`` (owned by the run, closed by :meth:`close`)
        that every write goes through."""
        self.config, self.dir, self._lock, self._created = config, run_dir, lock, created
        self.settings = RunSettings.from_config(config)
        self.world = world or World()
        self.dir_fd = dir_fd
        keep = self.settings.keep_checkpoints
        self.checkpoints = CheckpointManager(
            run_dir / "checkpoints", keep_last=keep, parent_fd=dir_fd
        )
        self.device = torch.device("cpu")
        self._closed = False
        self.resumed_payload: dict[str, Any] | None = None
        self.resumed_source = "the resumed checkpoint"  # "checkpoint <file>" once resumed

    @classmethod
    def start(
        cls,
        plan: RunPlan,
        *,
        name: str,
        multi_process: bool = False,
    ) -> Run:
        """Open (or create) the run folder of a plan (its config settled: a resume's merge is
        already made), take its lock, set up device, threads and seeds. Raises
        ConfigError for a folder in use or a fresh run into a folder with checkpoints.

        Under ``torchrun`` (``multi_process`` trainers only) every rank joins the process group
        and uses rank 0's run folder; only rank 0 takes the lock and writes to it."""
        world = World.from_env()
        if world.distributed and not multi_process:
            raise ConfigError(
                f"started by torchrun with WORLD_SIZE={world.size}, but only algo=impala trains "
                f"with several learner processes; run this one with python -m rltrans.train"
            )
        settings = plan.run
        device = _learner_device(settings, world)
        distributed.init(world, device)
        if not world.is_main:
            return cls._join(plan.config, world, device)
        given = settings.run_dir
        run_dir = Path(given) if given is not None else default_run_dir(name, settings.seed)
        lock, created, fd = None, False, None
        new_parents = missing_parents(run_dir)  # what a failed start removes again
        try:
            # The lock comes first: a process that fails to take it removes nothing. A folder
            # that is not rltrans's is refused before anything (the lock file) is written in it.
            created = make_run_dir(run_dir)
            fd = open_run_dir(run_dir)
            if not created:
                check_entries(run_dir, fd)  # links and special files are named first
                check_claimable(run_dir, fd)
            lock = RunFolderLock(run_dir, fd)
            lock.acquire()
        except BaseException as err:
            if fd is not None:
                os.close(fd)
            if created:  # e.g. a full disk refused the lock file (acquire removed it)
                remove_empty([run_dir, *new_parents])
            distributed.broadcast_object(("error", str(err) or type(err).__name__))
            distributed.shutdown()
            _not_started(err, created)
            raise
        try:
            check_entries(run_dir, fd)
            if not settings.resume:
                cls._fresh_folder(settings, run_dir, fd)
            run = cls(plan.config.replace(run_dir=str(run_dir)), run_dir, lock, created, world, fd)
            run.device = device
            setup(run.settings)
            mark(fd)
            save_config(run.config, fd)
        except BaseException as err:
            if created:
                remove_created(run_dir, fd, lock)
                remove_empty(new_parents)
            lock.release(remove=lock.created)  # a refused folder is left as it was found
            os.close(fd)
            distributed.broadcast_object(("error", str(err) or type(err).__name__))
            distributed.shutdown()
            _not_started(err, created)
            raise
        distributed.broadcast_object(("ok", str(run_dir)))
        return run

    @classmethod
    def _join(cls, config: Frozen, world: World, device: torch.device) -> Run:
        """A rank other than 0: wait for rank 0 to settle the run folder, then use it."""
        kind, value = distributed.broadcast_object(None)
        if kind == "error":  # rank 0 said why on its stderr; stop with it
            distributed.shutdown()
            raise ConfigError(f"learner process 0 stopped: {value}")
        run_dir = Path(value)
        run = cls(config.replace(run_dir=str(run_dir)), run_dir, None, False, world)
        run.device = device
        setup(run.settings)
        return run

    @staticmethod
    def _fresh_folder(settings: RunSettings, run_dir: Path, dir_fd: int) -> None:
        """A fresh run's folder: refused where it holds another run's checkpoints, emptied
        first with ``overwrite=true``."""
        if CheckpointManager(run_dir / "checkpoints").latest() is not None:
            if not settings.overwrite:
                raise ConfigError(
                    f"run folder {run_dir} already holds checkpoints of another run; continue "
                    f"it with resume=true, replace it with overwrite=true, or pick a new run_dir"
                )
            remove_for_overwrite(run_dir, dir_fd)  # start over: nothing old stays

    def close(self) -> None:
        """Release the folder (also released by the OS when the process ends) and leave the
        learner process group, if any. Nothing is saved after this."""
        if self._lock is not None:
            self._lock.release()
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = self.checkpoints.parent_fd = None
            self._closed = True
        distributed.shutdown()

    @contextlib.contextmanager
    def building(self, what: str) -> Iterator[None]:
        """Build ``what`` (``env``, ``agent``, ``dataset``): a failure becomes one ConfigError
        line naming the config group, and a run folder this run created is removed again, so
        a typo leaves no empty run behind."""
        try:
            with building(what):
                yield
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Delete the folder if this run created it and saved nothing in it, then release it."""
        lock = self._lock if self.world.is_main and self._created else None
        if lock is not None and self.dir_fd is not None and self.checkpoints.latest() is None:
            remove_created(self.dir, self.dir_fd, lock)
        self.close()

    # ------------------------------------------------------------------------- checkpoints

    def payload(
        self,
        step: int,
        agent: torch.nn.Module,
        learner: Any,
        spaces: tuple[gym.Space, gym.Space],
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Everything a resume, ``load_policy`` or ``rltrans.evaluate`` needs (weights_only-safe).

        ``step`` counts the run's budget unit (env steps online, gradient steps offline).
        """
        return {
            "model": agent.state_dict(),
            "learner": learner.state_dict(),
            "global_step": step,
            "rng": rng_state(),
            **self._static_payload(spaces),
            **(extra or {}),
        }

    def _static_payload(self, spaces: tuple[gym.Space, gym.Space]) -> dict[str, Any]:
        """What every payload of a run holds unchanged (its config, its spaces), made once: a
        trainer copies its payload before each long update, and these cost it most."""
        key = (id(spaces[0]), id(spaces[1]))
        if getattr(self, "_static", (None,))[0] != key:
            names = ("config", "observation_space", "action_space")
            parts = (thaw(self.config), *map(serialize_space, spaces))
            self._static = (key, dict(zip(names, parts, strict=True)))
        return dict(self._static[1])

    def save(self, step: int, *args: Any, **kwargs: Any) -> Path | None:
        """Write a checkpoint of :meth:`payload` (atomic, rotated); returns its path (None on
        learner processes other than rank 0, which write nothing)."""
        return self.save_payload(step, self.payload(step, *args, **kwargs))

    def save_payload(self, step: int, payload: dict[str, Any]) -> Path | None:
        """Write ``payload`` (one :meth:`payload` made, perhaps earlier) as the checkpoint of
        ``step``; None on learner processes other than rank 0."""
        if not self.world.is_main:
            return None
        if self._closed:
            raise RuntimeError(f"run {self.dir} is closed; it saves nothing more")
        return self.checkpoints.save(step, payload)

    def storage_stop(self, step: int, err: StorageError) -> StorageError:
        """The one line for a write the file system refused mid-run (a full disk, at a
        checkpoint or an event flush): what failed, the newest complete checkpoint, and how to
        go on once there is space."""
        newest = self.checkpoints.newest_in_words()
        if newest is None:
            how = "it has no checkpoint yet: free space, then start it again"
        else:
            how = (
                f"its newest complete checkpoint is {newest}: free space, then continue from it "
                f"with `python -m rltrans.train resume=true run_dir={self.dir}`"
            )
        return StorageError(err.errno, f"{err}; training stopped at step {step}, {how}")

    def resume(
        self, agent: torch.nn.Module, learner: Any, spaces: tuple[gym.Space, gym.Space]
    ) -> int:
        """On a resumed run: check the spaces, restore weights, optimizer, schedule and RNG
        states, and return the step reached (the payload stays in ``resumed_payload`` for what
        else a trainer saved). On a fresh run: 0."""
        if not self.settings.resume:
            return 0
        payload = self.checkpoints.load_latest()
        if payload is None:
            where = self.checkpoints.directory
            raise ConfigError(f"resume=true but no loadable checkpoint in {where}")
        check_same_spaces(payload_spaces(payload), spaces, actual_label="this run has")
        source = f"checkpoint {self.checkpoints.latest()}"
        check_finite_weights(payload.get("model"), source)
        check_saved_state(payload, source)  # as when the plan was made: the file may differ
        with restoring(source):
            step = restore_payload(payload, agent, learner)
        self.resumed_payload, self.resumed_source = payload, source
        return step

    def whole_updates(self, steps_per_update: int, made_of: str) -> int:
        """Updates needed for ``total_steps`` env steps, rounded up to whole updates of
        ``steps_per_update`` (``made_of`` names its factors); the rounding is said on stderr."""
        asked = self.settings.total_steps
        total = max(1, -(-asked // steps_per_update))  # ceil
        rounded = total * steps_per_update != asked
        if rounded and not self.settings.resume and self.world.is_main:
            print(
                f"total_steps={asked} rounded up to {total * steps_per_update}: "
                f"whole updates of {made_of} = {steps_per_update} steps",
                file=sys.stderr,
            )
        return total

    def stop_message(self, step: int, err: Exception) -> None:
        """Say why training stopped early (a non-finite loss) and which checkpoint is good."""
        print(
            f"training stopped at step {step}: {err}. Last good checkpoint: "
            f"{self.latest_checkpoint()}",
            file=sys.stderr,
        )

    def latest_checkpoint(self) -> str | None:
        """Path of the newest complete checkpoint, for the summary line."""
        latest = self.checkpoints.latest()
        return str(latest) if latest else None


def payload_spaces(payload: dict[str, Any]) -> tuple[gym.Space, gym.Space]:
    """The (observation, action) spaces a checkpoint was trained on. Format 1 checkpoints also
    stored a description dict under the plain keys and the exact JSON under ``*_json``."""
    try:
        if "observation_space_json" in payload:  # format 1
            found = (
                deserialize_space(payload["observation_space_json"]),
                deserialize_space(payload["action_space_json"]),
            )
        else:
            found = (
                deserialize_space(payload["observation_space"]),
                deserialize_space(payload["action_space"]),
            )
        for name, space in zip(("observation_space", "action_space"), found, strict=True):
            if not isinstance(space, gym.Space):
                raise TypeError(f"{name} is a {type(space).__name__}")
            size = gym.spaces.flatdim(space)
            if size > MAX_SPACE_SIZE:
                raise ValueError(f"{name} has {size} dimensions, more than {MAX_SPACE_SIZE}")
        return found
    except KeyError as err:
        raise CheckpointError(f"checkpoint lacks {err}; it was not written by rltrans") from None
    except Exception as err:  # minari's reader raises many types for a malformed description
        raise CheckpointError(f"checkpoint spaces: not a valid space description ({err})") from None


__all__ = [
    "CONFIG_FILE",
    "LOCK_FILE",
    "RUN_ENTRIES",
    "Run",
    "RunFolderLock",
    "default_run_dir",
    "load_checkpoint",
    "payload_spaces",
    "refuse_links",
    "seed_everything",
    "select_device",
    "set_threads",
    "setup",
]
