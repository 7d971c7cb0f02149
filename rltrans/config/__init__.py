"""Config for the command-line tools: the shipped YAML, its typed schema, Hydra composition.

The YAML files in ``configs/`` are the documentation: every knob carries a comment where it
is defined, and ``--help`` prints the files of the chosen options. Every composed config is
checked against the schema before a run builds anything; the same checks serve command
lines and configs read back from files (checkpoints, a run folder's config.yaml).

Modules, each importing only those listed before it:

- :mod:`~rltrans.config.frozen`: a resolved config as read-only plain data
- :mod:`~rltrans.config.errors`: ConfigError and the one-message form of several problems
- :mod:`~rltrans.config.files`: where the shipped YAML lives (groups, options, kinds)
- :mod:`~rltrans.config.spec`: what one key accepts and the one-line reports of a bad one
- :mod:`~rltrans.config.resources`: the one resource estimate of a final config, size caps
- :mod:`~rltrans.config.keys`: what every key accepts (ranges, choices, null), per section
- :mod:`~rltrans.config.schema`: :func:`check_config` against those specs, cross checks
- :mod:`~rltrans.config.applies`: knobs that apply only under another choice
- :mod:`~rltrans.config.compose`: Hydra composition, override checks, defaults, --help
- :mod:`~rltrans.config.trust`: the trust boundary every config read from a file passes
- :mod:`~rltrans.config.plan`: the run plan, one run resolved once (:mod:`rltrans.api`)

>>> cfg = load_config(["agent.dim=32"])
>>> cfg.agent.dim
32
"""

from rltrans.config.compose import config_help, default_config, load_config, to_container
from rltrans.config.errors import ConfigError, format_problems
from rltrans.config.files import config_groups, config_root, group_kinds, group_options
from rltrans.config.schema import agent_knob_names, check_config, config_specs, keyword_mappings
from rltrans.config.spec import Spec
from rltrans.config.trust import (
    checked_file_config,
    env_code,
    read_run_config,
    read_yaml,
    refuse_env_code,
)

__all__ = [
    "ConfigError",
    "Spec",
    "agent_knob_names",
    "check_config",
    "checked_file_config",
    "config_groups",
    "config_help",
    "config_root",
    "config_specs",
    "default_config",
    "env_code",
    "format_problems",
    "group_kinds",
    "group_options",
    "keyword_mappings",
    "load_config",
    "read_run_config",
    "read_yaml",
    "refuse_env_code",
    "to_container",
]
