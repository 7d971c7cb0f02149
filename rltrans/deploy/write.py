"""A loaded policy's acting step traced once (``torch.export``, batch dynamic) and written as
an ONNX model (``torch.onnx``'s exporter, checked by ``onnx.checker`` and run once by ONNX
Runtime against PyTorch) or a ``.pt2`` archive, with its JSON sidecar beside it.

:func:`acting_program` builds the program and its tensor descriptions; :func:`write_program`
traces and writes it. What fails to trace or to convert raises :class:`ExportError` with one
line naming the policy and the exporter's first line.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rltrans.agents.context_policy import ContextPolicy
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.config.errors import first_line
from rltrans.config.keys import MAX_ENVS
from rltrans.deploy import ExportError, Format
from rltrans.deploy.context import STATE_DOCS, STATE_FIELDS, ContextProgram
from rltrans.deploy.memory import MemoryProgram, ObservationInputs
from rltrans.deploy.tensors import TensorSpec, spec_of
from rltrans.fsutil import write_file
from rltrans.policy import Policy
from rltrans.spaces import serialize_space
from rltrans.version import __version__

SUFFIXES = {"onnx": ".onnx", "torch": ".pt2"}
EXAMPLE_ENVS = 2  # the batch the program is traced with (dynamic: any batch runs)
TOLERANCE = 1e-5  # ONNX Runtime against PyTorch on the example, float outputs
EXTRA = 'pip install "rltrans[export]"'
# What torch's exporters warn about their own internals on every export of these programs: an
# RNN's flat weight list rebuilt while tracing, a deprecated pytree check, the archive's note
# on weights that share storage. Nothing a user can act on.
EXPORTER_NOISE = (
    r"The tensor attributes .*_flat_weights",
    r".*isinstance\(treespec, LeafSpec\)",
    r"No complete tensor found in the group",
)


@contextlib.contextmanager
def quiet_exporter() -> Any:
    """The exporters' own warnings (:data:`EXPORTER_NOISE`) silenced, others kept."""
    with warnings.catch_warnings():
        for message in EXPORTER_NOISE:
            warnings.filterwarnings("ignore", message=message)
        yield


@dataclass
class ActingProgram:
    """A policy's acting step as a module of flat tensors, with what each tensor is."""

    module: nn.Module
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    example: tuple[Tensor, ...]
    state_names: tuple[str, ...]  # the state fields, in the inputs' order

    def state_tensors(self, state: Any) -> tuple[Tensor, ...]:
        """The exported state tensors of a ``load_policy`` acting state (batch-first)."""
        module = self.module
        if isinstance(module, ContextProgram):
            return tuple(getattr(state, name) for name in STATE_FIELDS)
        return module.memory.tensors(state)


def _observation_specs(observation: ObservationInputs, leaves: tuple[Tensor, ...]) -> list:
    """One spec per observation leaf."""
    doc = "observation (float64 Box observations as float32)"
    return [
        spec_of(t, name, "observation", doc)
        for name, t in zip(observation.names, leaves, strict=True)
    ]


def _state_specs(names: tuple, docs: tuple, tensors: tuple) -> tuple[list, list]:
    """The state inputs ``state.<name>`` and the outputs ``next_state.<name>`` replacing them."""
    ins, outs = [], []
    for name, doc, t in zip(names, docs, tensors, strict=True):
        initial = False if t.dtype == torch.bool else 0
        ins.append(
            spec_of(t, f"state.{name}", "state", doc, initial=initial, pairs=f"next_state.{name}")
        )
        outs.append(
            spec_of(t, f"next_state.{name}", "state", doc, initial=initial, pairs=f"state.{name}")
        )
    return ins, outs


def _noise_spec(noise: Tensor, kind: str) -> TensorSpec:
    """The sampling program's noise input: U(0, 1) or N(0, 1) draws, fresh at every step."""
    law = "U(0, 1)" if kind == "uniform" else "N(0, 1)"
    doc = f"{law} draws, fresh at every step, that the action is sampled with"
    return spec_of(noise, "noise", "noise", doc, extra={"distribution": kind})


def _memory_program(policy: Policy, sample: bool, value: bool) -> ActingProgram:
    """The program of a memory agent (mlp, lstm, gru, transformers, Universal Transformer)."""
    program = MemoryProgram(policy.agent, sample=sample, value=value)
    observation, memory, outputs = program.observation, program.memory, program.outputs
    leaves = observation.example(EXAMPLE_ENVS)
    start = torch.tensor([True, False])
    state = memory.tensors(policy.agent.initial_state(EXAMPLE_ENVS))
    inputs = _observation_specs(observation, leaves)
    inputs.append(
        spec_of(start, "episode_start", "episode_start", "true where obs begins an episode")
    )
    example: tuple[Tensor, ...] = (*leaves, start)
    if sample:
        obs = observation.tree(leaves)
        dist = policy.agent.act_distribution(obs, policy.agent.initial_state(EXAMPLE_ENVS), None)[0]
        noise = outputs.noise_like(dist)
        inputs.append(_noise_spec(noise, outputs.noise))
        example += (noise,)
    state_in, state_out = _state_specs(memory.names, memory.docs, state)
    example += state
    with torch.no_grad():
        result = program(*example)
    docs = ("action in the env's values", *outputs.docs, "value estimate")
    names = ("action", *outputs.names, "value")
    roles = ("action", *(["distribution"] * len(outputs.names)), "value")
    picked = [
        (n, r, d) for n, r, d in zip(names, roles, docs, strict=True) if value or r != "value"
    ]
    heads = [spec_of(t, n, r, d) for (n, r, d), t in zip(picked, result, strict=False)]
    return ActingProgram(program, [*inputs, *state_in], [*heads, *state_out], example, memory.names)


def _context_program(policy: Policy, sample: bool, target: float | None) -> ActingProgram:
    """The program of a return-conditioned policy (DT, BC)."""
    program = ContextProgram(policy.agent, sample=sample)
    observation = ObservationInputs(policy.agent.observation_space)
    (obs,) = observation.example(EXAMPLE_ENVS)
    n = EXAMPLE_ENVS
    start, reward = torch.tensor([True, False]), torch.zeros(n)
    goal = 0.0 if target is None else float(target)
    fresh = policy.agent.initial_state(n, goal)
    state = tuple(getattr(fresh, name) for name in STATE_FIELDS)
    inputs = _observation_specs(observation, (obs,))
    inputs += [
        spec_of(start, "episode_start", "episode_start", "true where obs begins an episode"),
        spec_of(reward, "reward", "reward", "reward of the previous step (any value at a start)"),
        spec_of(
            reward,
            "target_return",
            "target_return",
            "return to aim for, read where an episode begins",
            default=target,
        ),
    ]
    example: tuple[Tensor, ...] = (obs, start, reward, torch.full((n,), goal))
    if sample:
        noise = torch.rand(n, policy.agent.action_codec.n)
        inputs.append(_noise_spec(noise, "uniform"))
        example += (noise,)
    state_in, state_out = _state_specs(STATE_FIELDS, STATE_DOCS, state)
    example += state
    with torch.no_grad():
        result = program(*example)
    docs = ("action in the env's values", "log-probabilities of each action (log_softmax)")
    roles = ("action", "distribution")
    heads = [
        spec_of(t, name, role, doc)
        for name, role, doc, t in zip(program.output_names, roles, docs, result, strict=False)
    ]
    return ActingProgram(program, [*inputs, *state_in], [*heads, *state_out], example, STATE_FIELDS)


def acting_program(
    policy: Policy, *, sample: bool = False, value: bool = False, target_return: float | None = None
) -> ActingProgram:
    """The acting step of a loaded policy as an :class:`ActingProgram` (on the CPU)."""
    agent = policy.agent
    if isinstance(agent, ContextPolicy):
        if value:
            raise ExportError(
                f"value=true: {type(agent).__name__} has no value head; export it with value=false"
            )
        target = policy.target_return if target_return is None else target_return
        return _context_program(policy, sample, target)
    if isinstance(agent, MemoryAgent):
        return _memory_program(policy, sample, value)
    raise ExportError(
        f"{type(agent).__name__} cannot be exported: rltrans exports its memory agents "
        f"(agent.kind=memory) and DT/BC"
    )


def trace(program: ActingProgram, what: str) -> torch.export.ExportedProgram:
    """The program traced by ``torch.export`` with the batch axis of every tensor dynamic."""
    batch = torch.export.Dim("batch", min=1, max=MAX_ENVS)
    shapes = {"inputs": tuple({0: batch} for _ in program.example)}
    try:
        with torch.no_grad(), quiet_exporter():
            return torch.export.export(
                program.module, program.example, dynamic_shapes=shapes, strict=False
            )
    except Exception as err:  # the exporter's many error types: one line naming the policy
        raise ExportError(f"{what} cannot be traced by torch.export: {first_line(err)}") from None


def _need(module: str) -> Any:
    """An optional package of the export extra, or ExportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(f"format=onnx needs {module}: {EXTRA}") from None


def onnx_bytes(exported: torch.export.ExportedProgram, program: ActingProgram, what: str) -> bytes:
    """The ONNX model of a traced program (names from its specs), checked by onnx.checker
    and run by ONNX Runtime on the example against PyTorch."""
    onnx = _need("onnx")
    _need("onnxscript")  # torch.onnx's exporter converts through it
    try:
        with quiet_exporter():
            converted = torch.onnx.export(
                exported,
                (),
                input_names=[s.name for s in program.inputs],
                output_names=[s.name for s in program.outputs],
                dynamo=True,
                external_data=False,
                verbose=False,
            )
        model = converted.model_proto
        onnx.checker.check_model(model, full_check=True)
    except ExportError:
        raise
    except Exception as err:
        raise ExportError(f"{what} cannot be exported to ONNX: {first_line(err)}") from None
    data = model.SerializeToString()
    check_onnx(data, program, what)
    return data


def check_onnx(data: bytes, program: ActingProgram, what: str) -> None:
    """ONNX Runtime's outputs on the example equal the PyTorch program's (float: 1e-5)."""
    ort = _need("onnxruntime")
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {s.name: t.numpy() for s, t in zip(program.inputs, program.example, strict=True)}
    got = session.run([s.name for s in program.outputs], feeds)
    with torch.no_grad():
        want = program.module(*program.example)
    for spec, a, b in zip(program.outputs, got, want, strict=True):
        b = b.detach().numpy()
        same = a.shape == b.shape and (
            np.allclose(a, b, rtol=0, atol=TOLERANCE) if b.dtype.kind == "f" else (a == b).all()
        )
        if not same:
            raise ExportError(f"{what}: ONNX Runtime's {spec.name} differs from PyTorch's")


def torch_bytes(exported: torch.export.ExportedProgram, program: ActingProgram, what: str) -> bytes:
    """The ``.pt2`` archive of a traced program, loaded back and run on the example."""
    buffer = io.BytesIO()
    with quiet_exporter():
        torch.export.save(exported, buffer)
        loaded = torch.export.load(io.BytesIO(buffer.getvalue())).module()
    with torch.no_grad():
        for spec, a, b in zip(
            program.outputs, loaded(*program.example), program.module(*program.example), strict=True
        ):
            if not torch.equal(a, b):
                raise ExportError(f"{what}: the saved program's {spec.name} differs from PyTorch's")
    return buffer.getvalue()


def sidecar(program: ActingProgram, policy: Policy, fmt: Format, file: Path, **facts: Any) -> dict:
    """The JSON description written beside the program (see docs/guides/deploy.md)."""
    spaces = {"observation_space": policy.observation_space, "action_space": policy.action_space}
    return {
        "rltrans": __version__,
        "format": fmt,
        "program": file.name,
        **facts,
        "batch_axis": 0,
        "inputs": [s.to_json() for s in program.inputs],
        "outputs": [s.to_json() for s in program.outputs],
        # Exact (Minari's serialisation, which Gymnasium's spaces rebuild from), not a summary.
        **{name: json.loads(serialize_space(space)) for name, space in spaces.items()},
    }


def write_program(
    program: ActingProgram, policy: Policy, fmt: Format, out: Path, what: str, **facts: Any
) -> Path:
    """Trace, convert, check and write ``out`` and its sidecar ``<out>.json``; the sidecar."""
    exported = trace(program, what)
    data = (
        onnx_bytes(exported, program, what)
        if fmt == "onnx"
        else torch_bytes(exported, program, what)
    )
    description = sidecar(program, policy, fmt, out, **facts)
    text = json.dumps(description, indent=1) + "\n"
    write_file(out, lambda f: f.write(data))
    side = out.with_name(out.name + ".json")
    write_file(side, lambda f: f.write(text.encode()))
    return side
