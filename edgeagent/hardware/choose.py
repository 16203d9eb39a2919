"""Choosing the (runtime, device, precision) for one model: ranking ∩ variants ∩ what really works.

``ranked`` takes the profile's first candidate that probes successfully. ``fastest`` times the
top K working candidates on this device and keeps the quickest (within the power budget when a
power reading is available); that decision is stored with the model hash and runtime versions
so a restart reuses it and an update of either invalidates it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeagent.hardware.probe import Prober, ProbeResult
from edgeagent.hardware.profile import Candidate, Profile
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import ModelPackage, Variant
from edgeagent.runtimes import RuntimeUnavailable, Session, get_runtime, installed_version

log = logging.getLogger(__name__)

PowerReader = Callable[[], "float | None"]


@dataclass(frozen=True)
class Option:
    """A profile candidate as it applies to one package."""

    rank: int  # position in the profile's ranking (0 = best)
    candidate: Candidate
    variant: Variant | None
    dropped: str = ""  # why it is not even tried: no such variant, runtime not installed

    @property
    def key(self) -> str:
        return self.candidate.key


def options_for(profile: Profile, package: ModelPackage) -> list[Option]:
    """Every candidate of the profile, with the package's matching variant or why there is none."""
    options = []
    for rank, candidate in enumerate(profile.candidates):
        variant = package.variant(candidate.runtime, candidate.precision)
        dropped = ""
        if variant is None:
            have = ", ".join(v.key for v in package.variants)
            dropped = f"package has no {candidate.runtime}/{candidate.precision} variant ({have})"
        else:
            try:
                installed_version(candidate.runtime)
            except RuntimeUnavailable as exc:
                dropped = str(exc)
        options.append(Option(rank, candidate, variant, dropped))
    return options


def is_cpu(candidate: Candidate) -> bool:
    """The CPU candidates ("CPU", "CPUExecutionProvider"): they work wherever the runtime does."""
    return candidate.device.upper().startswith("CPU")


def device_listed(candidate: Candidate) -> bool:
    """Whether ``candidate``'s device may be here: False only when its runtime is missing, or
    lists its devices and not this one (an onnxruntime without ``CUDAExecutionProvider``, an
    OpenVINO listing only ``CPU``: what ``edgeagent profile`` prints at start). A device the
    runtime cannot list without loading a model (a LiteRT delegate named by path) counts as
    listed: its probe decides. Imports the runtime, as probing it would."""
    if is_cpu(candidate):
        return True
    try:
        runtime = get_runtime(candidate.runtime)
    except RuntimeUnavailable:
        return False
    if candidate.options.get("delegate"):
        return True
    try:
        return runtime.lists(candidate.device) is not False
    except Exception as exc:  # a runtime that fails to list its devices: the probe will tell
        log.warning("%s could not list its devices: %s", candidate.runtime, exc)
        return True


def release_variants(
    profile: Profile,
    available: Sequence[str],
    *,
    cpu_fallback: bool = True,
    failed: Collection[str] = (),
    listed: Callable[[Candidate], bool] = device_listed,
) -> list[str]:
    """The variant keys (``runtime/precision``) of a release a device downloads.

    The same ranking as ``options_for`` at start, applied before any file exists (nothing can
    be probed yet): the best-ranked candidate whose variant the release offers, whose runtime
    is installed and whose device its runtime lists here (``listed``: ``device_listed``); with
    ``cpu_fallback``, also the best-ranked CPU candidate's variant, so an accelerator that
    fails its probe or at run time still has somewhere to go. So even a device's first
    release, before any probe, never fetches a variant for a device its runtimes do not list.
    Candidates in ``failed`` (keys whose probe already failed here, e.g. a listed GPU whose
    driver is broken: ``Accelerators.failed_candidates``, which remembers an accelerator's
    failure across models and versions for the same runtime version) are skipped, as the probe
    at start would skip them. Empty when the release has nothing this device can run.
    """
    usable = []
    for candidate in profile.candidates:
        key = f"{candidate.runtime}/{candidate.precision}"
        if key not in available or candidate.key in failed:
            continue
        try:
            installed_version(candidate.runtime)
        except RuntimeUnavailable:
            continue
        if not listed(candidate):
            continue
        usable.append((candidate, key))
    if not usable:
        return []
    picked = [usable[0][1]]
    if cpu_fallback and not is_cpu(usable[0][0]):
        cpu = next((key for candidate, key in usable if is_cpu(candidate)), None)
        if cpu is not None and cpu not in picked:
            picked.append(cpu)
    return picked


def time_session(
    session: Session, feeds: Mapping[str, np.ndarray], seconds: float, *, min_runs: int = 3
) -> float:
    """Median batch-1 latency in ms over about ``seconds`` (at least ``min_runs`` runs)."""
    session.run(feeds)  # warm-up: first runs pay for lazy allocation
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < min_runs or (time.perf_counter() < deadline and len(samples) < 1000):
        started = time.perf_counter()
        session.run(feeds)
        samples.append((time.perf_counter() - started) * 1000)
    return float(np.median(samples))  # numpy is loaded; statistics would add decimal


@dataclass
class Choice:
    """The outcome for one package: the working session (if any) and everything learned."""

    package: str
    mode: str
    options: list[Option]
    results: dict[str, ProbeResult] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    power_w: dict[str, float] = field(default_factory=dict)
    chosen: Option | None = None
    session: Session | None = None
    reason: str = ""

    def fallback_order(self) -> list[Option]:
        """The chosen option first, then every other usable one in ranking order."""
        usable = [o for o in self.options if not o.dropped]
        if self.chosen is None:
            return usable
        return [self.chosen, *(o for o in usable if o.key != self.chosen.key)]


def why_not(choice: Choice, option: Option) -> str:
    """Why an option is not the choice: dropped, failed its probe, slower, or not needed."""
    if option.dropped:
        return option.dropped
    result = choice.results.get(option.key)
    if result is not None and not result.ok:
        return result.error
    if option.key in choice.latency_ms:
        watts = choice.power_w.get(option.key)
        power = f" at {watts:.1f} W" if watts is not None else ""
        return f"works, {choice.latency_ms[option.key]:.2f} ms{power}: not the pick"
    if result is not None:
        return "works"
    return "not tried (a better-ranked candidate works)"


class Chooser:
    """Applies one choice mode to a package; the Prober does the loading and caching."""

    def __init__(
        self,
        prober: Prober,
        *,
        mode: str = "ranked",
        top_k: int = 3,
        seconds: float = 1.0,
        power_budget_w: float | None = None,
        power_w: PowerReader | None = None,
    ) -> None:
        self.prober = prober
        self.mode = mode
        self.top_k = top_k
        self.seconds = seconds
        self.power_budget_w = power_budget_w
        self.power_w = power_w

    def choose(self, profile: Profile, package: ModelPackage, *, use_cache: bool = True) -> Choice:
        choice = Choice(package.name, self.mode, options_for(profile, package))
        model_hash = package.content_hash()
        if self.mode == "fastest":
            self._fastest(choice, profile, package, model_hash, use_cache)
        else:
            self._ranked(choice, package, model_hash, use_cache)
        if choice.chosen is not None:
            log.info("%s runs on %s (%s)", package.name, choice.chosen.key, choice.reason)
        return choice

    def _try(
        self, choice: Choice, package: ModelPackage, option: Option, model_hash: str, use: bool
    ) -> Session | None:
        assert option.variant is not None
        session, result = self.prober.load(
            package, option.candidate, option.variant, model_hash=model_hash, use_cache=use
        )
        choice.results[option.key] = result
        return session

    def _ranked(self, choice: Choice, package: ModelPackage, model_hash: str, use: bool) -> None:
        for option in choice.options:
            if option.dropped:
                continue
            session = self._try(choice, package, option, model_hash, use)
            if session is not None:
                choice.chosen, choice.session = option, session
                choice.reason = f"ranked: the best working candidate (rank {option.rank + 1})"
                return
        choice.reason = "no candidate works"

    def _decision_key(self, profile: Profile, model_hash: str) -> str:
        return f"{model_hash}|{profile.name}|fastest"

    def _versions(self, options: list[Option]) -> dict[str, str]:
        runtimes = sorted({o.candidate.runtime for o in options if not o.dropped})
        return {name: installed_version(name) for name in runtimes}

    def _fastest(
        self, choice: Choice, profile: Profile, package: ModelPackage, model_hash: str, use: bool
    ) -> None:
        versions = self._versions(choice.options)
        key = self._decision_key(profile, model_hash)
        decision = self.prober.cache.get_decision(key) if use else None
        if decision and decision.get("versions") == versions:
            option = next((o for o in choice.options if o.key == decision.get("candidate")), None)
            if option is not None and not option.dropped:
                session = self._try(choice, package, option, model_hash, use)
                if session is not None:
                    choice.chosen, choice.session = option, session
                    latency = decision.get("latency_ms")
                    choice.latency_ms = dict(latency) if isinstance(latency, dict) else {}
                    choice.reason = "fastest: decision cached for this model hash and runtimes"
                    return
        elif decision:
            log.info("%s: runtime versions changed, timing candidates again", package.name)
        feeds = sample_feeds(package)
        for option in choice.options:
            if option.dropped or len(choice.latency_ms) >= self.top_k:
                continue
            session = self._try(choice, package, option, model_hash, use)
            if session is None:
                continue
            self._measure(choice, option, session, feeds)
        self._pick(choice)
        if choice.chosen is not None:
            self.prober.cache.put_decision(
                key,
                {
                    "candidate": choice.chosen.key,
                    "versions": versions,
                    "latency_ms": choice.latency_ms,
                    "power_w": choice.power_w,
                    "at": time.time(),
                },
            )

    def _measure(self, choice: Choice, option: Option, session: Session, feeds) -> None:
        """Time one working session; keep it only while it is the fastest so far."""
        if self.power_w is not None:
            self.power_w()  # start a fresh averaging window (energy counters read deltas)
        choice.latency_ms[option.key] = round(time_session(session, feeds, self.seconds), 3)
        watts = self.power_w() if self.power_w is not None else None
        if watts is not None:
            choice.power_w[option.key] = round(watts, 2)
        best = choice.chosen
        if best is None or self._better(choice, option, best):
            if choice.session is not None:
                choice.session.close()
            choice.chosen, choice.session = option, session
        else:
            session.close()

    def _within_budget(self, choice: Choice, option: Option) -> bool:
        watts = choice.power_w.get(option.key)
        return self.power_budget_w is None or watts is None or watts <= self.power_budget_w

    def _better(self, choice: Choice, option: Option, best: Option) -> bool:
        fits, best_fits = self._within_budget(choice, option), self._within_budget(choice, best)
        if fits != best_fits:
            return fits
        if not fits:  # neither fits the budget: the one drawing less power
            return choice.power_w[option.key] < choice.power_w[best.key]
        return choice.latency_ms[option.key] < choice.latency_ms[best.key]

    def _pick(self, choice: Choice) -> None:
        if choice.chosen is None:
            choice.reason = "no candidate works"
            return
        timed = ", ".join(f"{k} {v:.2f} ms" for k, v in choice.latency_ms.items())
        budget = ""
        if self.power_budget_w is not None and choice.power_w:
            budget = f" within {self.power_budget_w:g} W"
            if not self._within_budget(choice, choice.chosen):
                budget = f"; none fits {self.power_budget_w:g} W, the least power drawn"
        choice.reason = f"fastest{budget} of {len(choice.latency_ms)} timed ({timed})"
