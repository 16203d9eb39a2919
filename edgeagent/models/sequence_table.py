"""A package's ``[sequence]`` table: the model keeps state between the requests of one stream.

A streaming model (a wake word, a voice-activity detector, a recurrent tracker) answers each
window from what it saw before. Where that state lives decides how it is kept apart for two
client streams (``engine.sequences``):

- ``state = "tensors"``: the graph takes its state as inputs and returns the next one as outputs
  (ONNX ``state_in``/``state_out``, Silero VAD's ``state``/``stateN``); ``pairs`` names each
  input with the output that feeds it on the sequence's next request. The agent keeps the
  returned tensors per sequence and feeds them back.
- ``state = "variables"``: the state lives inside the runtime (TFLite resource variables, the
  ``VAR_HANDLE`` ops); the agent gives each live sequence a session of its own.

Triton's sequence batcher is the model: a request names its ``sequence_id`` and marks the
first (``sequence_start``) and last (``sequence_end``) request of its stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.models.tensor_tables import TensorSpec
from edgeagent.models.toml_fields import Fields

STATE_KINDS = ("tensors", "variables")


@dataclass(frozen=True)
class SequenceSpec:
    """How a stateful model's state is carried from one request of a sequence to the next."""

    state: str  # one of STATE_KINDS
    pairs: tuple[tuple[str, str], ...] = ()  # (input, output) for state = "tensors"

    @property
    def state_inputs(self) -> tuple[str, ...]:
        return tuple(i for i, _ in self.pairs)

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(o for _, o in self.pairs)

    def table(self) -> dict[str, Any]:
        """The TOML table ``read_sequence`` reads back."""
        pairs = [{"input": i, "output": o} for i, o in self.pairs] if self.pairs else None
        return {"state": self.state, "pairs": pairs}


def read_sequence(
    manifest: Path,
    table: Any,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
) -> SequenceSpec | None:
    """The ``[sequence]`` table checked against the package's tensors; None when absent."""
    if table is None:
        return None
    fields = Fields(manifest, "sequence", table)
    fields.unknown({"state", "pairs"})
    state = fields.get("state", str, choices=STATE_KINDS)
    entries = fields.get("pairs", list, [])
    if state == "variables" and entries:
        fields.fail('state = "variables" keeps its state in the runtime: no pairs', "pairs")
    if state == "tensors" and not entries:
        fields.fail('state = "tensors" needs at least one {input, output} pair', "pairs")
    by_input = {t.name: t for t in inputs}
    by_output = {t.name: t for t in outputs}
    pairs: list[tuple[str, str]] = []
    for index, entry in enumerate(entries):
        pair = Fields(manifest, f"sequence.pairs[{index}]", entry)
        pair.unknown({"input", "output"})
        name_in, name_out = pair.get("input", str), pair.get("output", str)
        if name_in not in by_input:
            pair.fail(f"{name_in!r} is not one of the package's inputs", "input")
        if name_out not in by_output:
            pair.fail(f"{name_out!r} is not one of the package's outputs", "output")
        if by_input[name_in].dtype != by_output[name_out].dtype:
            pair.fail(
                f"input {name_in!r} is {by_input[name_in].dtype} but output {name_out!r} is "
                f"{by_output[name_out].dtype}: a state is fed back as it was returned"
            )
        if any(name_in == i or name_out == o for i, o in pairs):
            pair.fail("names a state tensor a second time")
        pairs.append((name_in, name_out))
    if len(pairs) == len(inputs):
        fields.fail("every input is a state: a request would have nothing to send", "pairs")
    return SequenceSpec(state, tuple(pairs))
