"""The scheduler's step for a runtime that samples itself (``GeneratingSession``).

Such a runtime is given whole generations: a sequence begins (prompt and sampling) in the
first step after it was admitted, then every step advances all of them by one step of the
runtime's own batching and turns what each produced into the same ``StepEvent`` a logits
step gives, so streaming, stop strings, max_tokens and metrics are the scheduler's as for
any runtime.
"""

from __future__ import annotations

from edgeagent.engine.language.sequence import SequenceState, StepEvent
from edgeagent.engine.text_requests import FINISH_LENGTH, FINISH_STOP
from edgeagent.runtimes.generative import GeneratingSession, GenerationSpec, Produced


def advance(session: GeneratingSession, sequences: list[SequenceState]) -> list[StepEvent]:
    """Begin the newly admitted generations, advance all by one step, assemble their text."""
    for sequence in sequences:
        if sequence.fed == 0:  # admitted since the last step
            sampler = sequence.sampler
            spec = GenerationSpec(
                tuple(sequence.prompt),
                sequence.max_tokens,
                sampler.temperature,
                sampler.top_p,
                sampler.top_k,
                sampler.seed,
            )
            session.begin(sequence.slot, spec)
            sequence.fed = len(sequence.prompt)
    produced = session.advance()
    return [
        produced_event(session, sequence, produced[sequence.slot])
        for sequence in sequences
        if sequence.slot in produced
    ]


def produced_event(session: GeneratingSession, sequence: SequenceState, got: Produced) -> StepEvent:
    """One generation's new tokens as a step event: its text, and why it ended if it did."""
    ended = False
    for token in got.tokens:
        if session.is_end(token):
            ended = True
            break
        sequence.generated.append(token)
        sequence.pending_tokens += 1
        sequence.fed += 1
    text = sequence.text.feed(got.text)
    finish = None
    if sequence.text.stopped or ended:
        finish = FINISH_STOP
    elif len(sequence.generated) >= sequence.max_tokens or got.finished:
        finish = FINISH_LENGTH
    if finish is not None:
        text += sequence.text.finish()
    return StepEvent(sequence, text, finish)
