"""python -m rltrans.export checkpoint=<file or run dir> [format=onnx|torch] [out=<file>] [...]

Writes a saved policy's acting step as a self-contained program: an ONNX model (``format=onnx``,
for ONNX Runtime and other runtimes; checked by ``onnx.checker`` and run once by ONNX Runtime
against PyTorch) or a ``torch.export`` archive (``format=torch``, ``.pt2``), and a JSON sidecar
``<out>.json`` beside it. The program's inputs are the observation, the episode-start flags and
the memory state (DT/BC: also the last reward and the target return); its outputs the action,
the distribution's parameters, the value if asked, and the next memory state. The batch of envs
is dynamic; an episode start resets that env's memory inside the program, as ``load_policy``.
The sidecar names every tensor with its role, shape, dtype and initial value, and holds the
observation and action spaces, so a loop needs nothing from rltrans. Prints one JSON line.
Knobs: configs/export.yaml (``--help``). From Python: ``rltrans.export(checkpoint, out)``.

Example::

    python -m rltrans.export checkpoint=runs/tmaze out=tmaze.onnx
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rltrans.cli import run_cli
from rltrans.deploy import FORMATS, ExportError
from rltrans.deploy.write import SUFFIXES, acting_program, write_program
from rltrans.fsutil import check_output
from rltrans.policy import load_policy, resolve_checkpoint

__all__ = ["ExportError", "export", "main"]


def export(
    checkpoint: str | Path,
    out: str | Path | None = None,
    format: str = "onnx",
    *,
    sample: bool = False,
    value: bool = False,
    target_return: float | None = None,
) -> dict[str, Any]:
    """Export a saved policy (checkpoint file or run dir) to ``out``; returns the summary.

    >>> import rltrans                                                  # doctest: +SKIP
    >>> rltrans.export("runs/tmaze", "tmaze.onnx")                      # doctest: +SKIP
    {'program': 'tmaze.onnx', 'sidecar': 'tmaze.onnx.json', ...}
    """
    if format not in FORMATS:
        raise ExportError(f"format={format!r}: valid formats: {', '.join(FORMATS)}")
    file = resolve_checkpoint(checkpoint)
    target = Path(out) if out is not None else file.with_suffix(SUFFIXES[format])
    check_output(target)  # a link or an unwritable folder: refused before tracing
    policy = load_policy(file, device="cpu", torch_threads=None)
    kind = _agent_name(policy.config)
    what = f"{kind} policy {file}"
    program = acting_program(policy, sample=sample, value=value, target_return=target_return)
    facts = {"checkpoint": str(file), "agent": kind, "sample": bool(sample)}
    side = write_program(program, policy, format, target, what, **facts)  # type: ignore[arg-type]
    return {
        "program": str(target),
        "sidecar": str(side),
        "format": format,
        "agent": kind,
        "inputs": [s.name for s in program.inputs],
        "outputs": [s.name for s in program.outputs],
    }


def _agent_name(config: dict[str, Any]) -> str:
    """The agent as its config names it: the backbone of a memory agent, else its kind."""
    agent = config.get("agent", {})
    kind = agent.get("kind", "memory")
    return str(agent.get("backbone", kind)) if kind == "memory" else str(kind)


def run(cfg: DictConfig) -> dict[str, Any]:
    """The command: export the policy a config names."""
    if cfg.checkpoint is None:
        raise ExportError("checkpoint=<file or run dir> is required")
    return export(
        cfg.checkpoint,
        cfg.out,
        cfg.format,
        sample=bool(cfg.sample),
        value=bool(cfg.value),
        target_return=cfg.target_return,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, export, print one JSON line."""
    return run_cli(argv, "export", __doc__, run)


class _CallableModule(types.ModuleType):
    """``rltrans.export(...)`` calls :func:`export`: the module is the function too."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
