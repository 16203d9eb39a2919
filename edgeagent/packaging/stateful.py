"""Recognise a stateful model at packaging, so the agent serves it per sequence.

Two shapes of state are recognised (``models.sequence_table``):

- state inside the runtime: a TFLite file with resource variables (``VAR_HANDLE``,
  ``READ_VARIABLE``, ``ASSIGN_VARIABLE`` ops) — every invoke changes what the next one answers;
- state passed through the graph: an input and an output whose names pair as one state before
  and after (``state_in``/``state_out``, ``h0``/``hn``, Silero VAD's ``state``/``stateN``, a
  cache's ``past_x``/``present_x``) with the same dtype and rank.

Pairing goes by these names only: two tensors that merely share a shape (an image in, an image
out) are not a state, and a wrong pair would feed one request's answer into the next.
"""

from __future__ import annotations

import re
from pathlib import Path

from edgeagent.models.sequence_table import SequenceSpec
from edgeagent.packaging.sources import NativeTensor, SourceModel

VARIABLE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"})

# (input pattern, output template): the output name a state input's next value goes by.
_RENAMES = (
    (r"(?P<x>.+)_in", "{x}_out"),
    (r"(?P<x>.+)_input", "{x}_output"),
    (r"(?P<x>.+)In", "{x}Out"),
    (r"in_(?P<x>.+)", "out_{x}"),
    (r"input_(?P<x>.+)", "output_{x}"),
    (r"past_(?P<x>.+)", "present_{x}"),
    (r"(?P<x>.+)0", "{x}n"),
    (r"(?P<x>.+)_0", "{x}_n"),
    (r"(?P<x>.+)", "{x}N"),
    (r"(?P<x>.+)", "{x}_out"),
    (r"(?P<x>.+)", "{x}_next"),
    (r"(?P<x>.+)", "next_{x}"),
    (r"(?P<x>.+)", "new_{x}"),
)


def sequence_of(source: SourceModel) -> SequenceSpec | None:
    """How ``source`` keeps state between requests, or None for a stateless model."""
    if source.runtime == "litert" and variable_ops(source.path):
        return SequenceSpec("variables")
    pairs = state_pairs(source.inputs, source.outputs)
    return SequenceSpec("tensors", pairs) if pairs else None


def variable_ops(path: Path) -> frozenset[str]:
    """The resource-variable ops a TFLite file holds (none: a stateless graph)."""
    from ai_edge_litert import interpreter

    model = interpreter.Interpreter(model_path=str(path))
    ops = {str(op.get("op_name", "")) for op in model._get_ops_details()}
    return frozenset(ops & VARIABLE_OPS)


def state_pairs(
    inputs: tuple[NativeTensor, ...], outputs: tuple[NativeTensor, ...]
) -> tuple[tuple[str, str], ...]:
    """(input, output) pairs that are one state before and after a request, by name."""
    by_name = {t.name: t for t in outputs}
    taken: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for tensor in inputs:
        for pattern, template in _RENAMES:
            match = re.fullmatch(pattern, tensor.name)
            if match is None:
                continue
            name = template.format(x=match["x"])
            other = by_name.get(name)
            if other is None or name in taken:
                continue
            if other.dtype == tensor.dtype and len(other.shape) == len(tensor.shape):
                pairs.append((tensor.name, name))
                taken.add(name)
                break
    if len(pairs) == len(inputs):
        return ()  # every input a "state": a recurrent cell's outputs, not a stream's state
    return tuple(pairs)
