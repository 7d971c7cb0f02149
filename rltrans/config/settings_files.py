"""The config files made from the typed settings: ``configs/algo/ppo.yaml``, ``impala.yaml``
and ``offline.yaml`` from :class:`PPOConfig`, :class:`ImpalaConfig` and
:class:`OfflineConfig`, and ``configs/train.yaml``'s own keys from
:class:`~rltrans.config.run_settings.RunSettings`: one line per field (``key: default  #
help``), so a knob's default, type, range and help are defined once, in its field
(:func:`rltrans.learners.settings.knob`); so are ``configs/runtime/*.yaml`` from the runtime
classes. The presets that build on them (``ppo_memory``, ``ppo_continuous``,
``impala_paper``) and the agent and env files stay hand-written.

After changing a field, write the files again (a test fails while they differ)::

    python -m rltrans.config.settings_files
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import Any

from rltrans.config.run_settings import LocalRuntime, ProcessRuntime, RayRuntime, RunSettings
from rltrans.config.spec import format_value
from rltrans.learners.settings import ImpalaConfig, OfflineConfig, PPOConfig, knob_of

COMMENT_COLUMN = 24  # where a line's comment starts (later when its key and value are longer)
WIDTH = 100


def prose(text: str) -> str:
    """``text`` as a file's opening comment lines (a newline starts a paragraph)."""
    return "\n".join(
        f"# {line}" for part in text.split("\n") for line in textwrap.wrap(part, WIDTH - 2)
    )


# Each file's opening lines (what it configures); --help lists an option by its first.
FILES: dict[str, tuple[type, str]] = {
    "algo/ppo": (
        PPOConfig,
        prose(
            "PPO (Schulman et al. 2017) with GAE, trained on segments of L steps with their stored "
            "memory."
        ),
    ),
    "algo/impala": (
        ImpalaConfig,
        prose(
            "IMPALA (Espeholt et al. 2018): actors roll out, the learner corrects for their lag "
            "with V-trace.\nThe defaults reuse each batch as PPO does (4 passes, clipped ratio, "
            "Adam: as RLlib's APPO), which solves memory tasks the paper's one pass does not; "
            "algo=impala_paper is the paper's setting."
        ),
    ),
    "algo/offline": (
        OfflineConfig,
        prose(
            "Offline training of return-conditioned policies (agent=dt|bc) on a fixed dataset "
            "(dataset=...).\nAdamW with linear warmup (Chen et al. 2021, appendix A); budget: "
            "train_steps= gradient steps."
        ),
    ),
}
# train.yaml: its header and defaults list (the groups), then the run's own keys.
TRAIN_HEADER = """\
# rltrans training: python -m rltrans.train [group=option ...] [key=value ...]
# Groups pick one YAML file each (configs/<group>/<option>.yaml); keys override single values.
# `agent` comes last: an agent file may switch the other groups in its own defaults list
# (agent=dt and agent=bc select algo=offline and env=dataset; Hydra applies such an override
# only to groups listed before the file that makes it).
defaults:
  - env: tmaze          # environment (configs/env/)
  - algo: ppo           # learning algorithm (configs/algo/)
  - runtime: local      # where IMPALA's actors run (configs/runtime/): local | process | ray
  - agent: gtrxl        # model recipe (configs/agent/)
  - _self_
"""
FILES["train"] = (RunSettings, TRAIN_HEADER.rstrip("\n"))
FILES["runtime/local"] = (
    LocalRuntime,
    prose(
        "Actors in the training process, stepped round-robin (deterministic; policy lag 0). "
        "IMPALA only."
    ),
)
FILES["runtime/process"] = (
    ProcessRuntime,
    prose(
        "Actor processes that fill shared-memory rollout slots while the learner trains. "
        "IMPALA only."
    ),
)
FILES["runtime/ray"] = (
    RayRuntime,
    prose(
        'Ray actors that act rollouts while the learner trains (pip install "rltrans[ray]"). '
        "IMPALA only."
    ),
)
COMMAND = "python -m rltrans.config.settings_files"


def yaml_value(value: Any) -> str:
    """A default as YAML 1.1 reads it back (``null``, ``true``, ``3.0e-4``: a dot and a sign)."""
    if isinstance(value, float) and value != 0 and not 1e-3 <= abs(value) < 1e6:
        mantissa, exponent = f"{value:e}".split("e")
        mantissa = mantissa.rstrip("0")
        mantissa += "0" if mantissa.endswith(".") else ""
        return f"{mantissa}e{int(exponent):+d}"  # 3.0e-4, 2.0e+6: YAML 1.1 needs the sign
    return format_value(value)


def commented(line: str, help: str) -> list[str]:
    """``line`` with ``help`` as its comment, wrapped at the file's width: the comment starts
    at the comment column (two spaces after a line that reaches it) and continues there."""
    first = line.ljust(COMMENT_COLUMN) if len(line) <= COMMENT_COLUMN - 2 else f"{line}  "
    rest = " " * COMMENT_COLUMN + "# "
    lines = textwrap.wrap(
        help.replace(" %", "\0%"),  # "10 %" stays on one line
        WIDTH,
        initial_indent=f"{first}# ",
        subsequent_indent=rest,
        break_on_hyphens=False,  # d4rl-atari, cuda:<n>
    )
    return [line.replace("\0", " ") for line in lines]


def render(name: str) -> str:
    """The text of ``configs/<name>.yaml`` made from its settings class."""
    cls, header = FILES[name]
    lines = header.splitlines()
    lines.append(f"# Made from {cls.__module__} by `{COMMAND}`.")
    for f in dataclasses.fields(cls):
        k = knob_of(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if isinstance(default, dict):
            lines += commented(f"{f.name}:", k.help)
            for key, value in default.items():
                lines += commented(f"  {key}: {yaml_value(value)}", k.items[key])
        else:
            lines += commented(f"{f.name}: {yaml_value(default)}", k.help)
    return "\n".join(lines) + "\n"


def write(root: Path) -> list[Path]:
    """Write every generated file under ``root`` (the configs folder); the paths written."""
    paths = []
    for name in FILES:
        path = root / f"{name}.yaml"
        path.write_text(render(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    from rltrans.config.files import config_root

    for path in write(Path(str(config_root()))):
        print(path, file=sys.stderr)
