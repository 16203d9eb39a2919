"""Placing a language model: every variant × device a generative runtime offers, proved by
generating a few tokens, ranked by the decode rate it measured.

The vision probe proves a candidate with one inference; a language model is proved the same
way in its own terms: it must load within the memory budget (the plugin refuses with the
numbers otherwise), tokenize, and greedily decode ``PROBE_TOKENS`` tokens. The fastest
candidate serves; the others are closed at once. A candidate that fails is reported with
its reason, and the model fails to load only when every one did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.models.package import ModelPackage, Variant
from edgeagent.models.text_golden import greedy
from edgeagent.runtimes import RuntimeLoadError, RuntimeUnavailable, get_runtime
from edgeagent.runtimes.generative import (
    GenerativeLoadRequest,
    GenerativeRuntime,
    GenerativeSession,
)

log = logging.getLogger(__name__)
PROBE_TOKENS = 8
PROBE_PROMPT = "The capital of France is"


class NoCandidate(RuntimeError):
    """No variant of the package loaded and generated on any device; says why for each."""


@dataclass(frozen=True)
class Attempt:
    """One variant × device tried: its decode rate, or why it cannot serve."""

    variant: str  # runtime/precision
    device: str  # "" when the runtime could not be asked for devices
    tokens_per_s: float | None = None
    error: str = ""

    def __str__(self) -> str:
        where = f"{self.variant} on {self.device}" if self.device else self.variant
        if self.tokens_per_s is None:
            return f"{where}: {self.error}"
        return f"{where}: {self.tokens_per_s:.1f} tokens/s"


@dataclass(frozen=True)
class Placed:
    session: GenerativeSession
    variant: Variant
    runtime: str
    device: str
    tokens_per_s: float
    tried: tuple[Attempt, ...]  # every candidate with its figure or its reason


def load_request(
    package: ModelPackage, variant: Variant, device: str, settings: LanguageSettings
) -> GenerativeLoadRequest:
    trained = package.text.context if package.text else settings.context
    return GenerativeLoadRequest(
        files=variant.files,
        device=device,
        context=min(settings.context, trained),
        sequences=settings.sequences,
        # every decode token plus one prefill chunk fit one llama_decode
        batch_tokens=settings.prefill_chunk + settings.sequences,
        threads=settings.threads or None,
        embedding=package.task == "embedding",
        # what a runtime that does not read GGUF metadata learns from the package
        options={
            "architecture": package.text.architecture if package.text else "unknown",
            "context_trained": trained,
            "precision": variant.precision,
        },
    )


def probe(session: GenerativeSession, count: int = PROBE_TOKENS) -> float:
    """Greedy-decode ``count`` tokens after the first on sequence 0; decode tokens per second
    (0 when the model ended at once). The sequence is freed afterwards."""
    answer = greedy(session, session.tokenize(PROBE_PROMPT, add_special=True), count + 1)
    steps = len(answer.tokens) - 1
    return steps / answer.decode_s if steps > 0 and answer.decode_s > 0 else 0.0


def place(package: ModelPackage, settings: LanguageSettings) -> Placed:
    """Load every candidate, probe it, keep the fastest (blocking: run it off the loop)."""
    tried: list[Attempt] = []
    best: Placed | None = None
    for variant in package.variants:
        try:
            runtime = get_runtime(variant.runtime)
        except RuntimeUnavailable as exc:
            tried.append(Attempt(variant.key, "", error=str(exc)))
            continue
        if not isinstance(runtime, GenerativeRuntime):
            error = f"{variant.runtime} is not a generative runtime"
            tried.append(Attempt(variant.key, "", error=error))
            continue
        for device in runtime.devices():
            try:
                session = runtime.load(load_request(package, variant, device, settings))
            except (RuntimeLoadError, OSError) as exc:
                tried.append(Attempt(variant.key, device, error=str(exc)))
                continue
            try:
                rate = probe(session) if package.task == "text-generation" else 0.0
            except Exception as exc:
                session.close()
                tried.append(Attempt(variant.key, device, error=f"the probe failed: {exc}"))
                continue
            tried.append(Attempt(variant.key, device, rate))
            candidate = Placed(session, variant, variant.runtime, device, rate, ())
            if best is None or rate > best.tokens_per_s:
                if best is not None:
                    best.session.close()
                best = candidate
            else:
                session.close()
    if best is None:
        reasons = "; ".join(map(str, tried)) or "none"
        raise NoCandidate(f"{package.name} {package.version}: {reasons}")
    log.info("%s %s: %s", package.name, package.version, "; ".join(map(str, tried)))
    return Placed(
        best.session, best.variant, best.runtime, best.device, best.tokens_per_s, tuple(tried)
    )
