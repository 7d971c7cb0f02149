"""Deployment: a trained policy's acting step as a self-contained program with its memory as
named inputs and outputs (``python -m rltrans.export``; :mod:`rltrans.export`).

An exported program is the acting function of ``load_policy`` made pure: every tensor the
policy carries from one step to the next (an RNN's h and c, a transformer's key/value window,
its validity, episode times and long memory, a Decision Transformer's context) enters as an
input and leaves as the output that replaces it, so the program writes nothing and one call is
one step for a batch of envs. At an episode start (``episode_start`` true for an env) the
program puts that env's state back to its initial value before the step, as ``load_policy``
forgets the env's previous episode. A JSON sidecar names every tensor with its role, shape,
dtype and initial value, and holds the spaces, so a loop needs nothing from rltrans.

* :mod:`rltrans.deploy.tensors`: the tensor descriptions and the action outputs;
* :mod:`rltrans.deploy.memory`: memory agents' programs (mlp, lstm, gru, the transformer
  stacks, the Universal Transformer);
* :mod:`rltrans.deploy.context`: DT and BC's program (the context window as state);
* :mod:`rltrans.deploy.write`: tracing, the ONNX and ``torch.export`` files, the sidecar.
"""

from __future__ import annotations

from rltrans.config import ConfigError
from rltrans.config.keys import FORMATS, Format


class ExportError(ConfigError):
    """A policy, or a part of it, that cannot be exported: one line that names it."""


__all__ = ["FORMATS", "ExportError", "Format"]
