"""Proving a candidate works: a real session load and one real inference, with a time limit.

A provider list says what a runtime was *built* with, not what the board can run (onnxruntime
lists CUDA and then quietly runs on the CPU). So a candidate counts only when the runtime plugin
loads the variant on the requested device and one inference returns finite outputs. Results are
cached under the state directory, keyed by the model's content hash, the candidate and the
runtime version, so a restart does not repeat a slow TensorRT build just to learn it fails.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.fsutil import write_json_atomic
from edgeagent.hardware.profile import Candidate
from edgeagent.models.golden import GoldenError, load_golden, sample_feeds
from edgeagent.models.package import ModelPackage, Variant
from edgeagent.models.session import load_request
from edgeagent.models.unsealer import Unsealer
from edgeagent.runtimes import (
    LoadRequest,
    RuntimeUnavailable,
    Session,
    get_runtime,
    installed_version,
)

log = logging.getLogger(__name__)

CACHE_FILE = "probe-cache.json"
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of loading one candidate and running it once."""

    candidate: str  # Candidate.key
    ok: bool
    error: str = ""  # the runtime's own text when it failed
    load_ms: float = 0.0
    run_ms: float = 0.0  # the first inference (includes lazy initialisation)
    runtime_version: str = ""
    at: float = 0.0  # wall-clock time of the probe
    cached: bool = False
    # Where a failure happened: "load", "run" (the first inference raised), "timeout" — the
    # device or its driver — or "answers" (NaN, wrong golden answers: this model's variant).
    stage: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_outputs(package: ModelPackage, outputs: Mapping[str, np.ndarray]) -> str:
    """Why an inference result is unusable, or "" when it is fine."""
    for spec in package.outputs:
        if spec.name not in outputs:
            return f"output {spec.name!r} is missing (got {', '.join(outputs) or 'none'})"
        value = np.asarray(outputs[spec.name])
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return f"output {spec.name!r} holds NaN or infinity"
    return ""


def run_rows(session: Session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The answers to a batch, run one row at a time and stacked.

    The probed session is the one that serves, and its runtime keeps memory sized for the
    largest batch it ran: the golden batch of four left onnxruntime's arena 6.5 MB larger in
    an idle daemon with MobileNetV2 INT8 (102.6 against 96.1 MB) than one row, which is all
    that a lone client needs. An output with no batch axis is left to one run of the whole batch.
    """
    rows = {len(value) for value in feeds.values() if np.ndim(value)}
    if len(rows) != 1 or (count := rows.pop()) < 2:
        return session.run(feeds)
    answers = [session.run({n: v[i : i + 1] for n, v in feeds.items()}) for i in range(count)]
    if any(np.ndim(value) == 0 for value in answers[0].values()):
        return session.run(feeds)
    return {name: np.concatenate([a[name] for a in answers]) for name in answers[0]}


def golden_problem(package: ModelPackage, session: Session, min_agreement: float) -> str:
    """Why the session gives wrong answers on the package's golden inputs, or "".

    A delegate can load, run and still compute garbage (a broken fp16 kernel, an int8 layer
    it mis-handles). The golden top-1 comes from the fp32 reference on inputs with a clear
    margin, chosen by the build so that every variant, int8 included, classifies them alike;
    each variant must reproduce them up to the threshold. Other tasks are held to their whole
    golden record (a detector's boxes, IoU-matched; tensors within their tolerance).
    """
    if min_agreement <= 0:
        return ""
    try:
        golden = load_golden(package)
    except GoldenError as exc:
        log.warning("%s: golden file unusable for probing (%s)", package.name, exc)
        return ""
    if golden is None or package.golden is None:
        return ""
    outputs = run_rows(session, golden.feeds)
    expected = golden.top1
    if expected is None:  # not a classifier: its boxes or tensors, as its task records them
        problem = golden.problem(outputs, top_k=1)
        return f"wrong answers on {package.golden.name}: {problem}" if problem else ""
    scores = np.asarray(outputs[package.outputs[0].name]).reshape(len(expected), -1)
    agree = int(np.sum(scores.argmax(axis=-1) == expected))
    if agree < min_agreement * len(expected):
        return (
            f"wrong answers: top-1 matches {package.golden.name} on {agree} of {len(expected)} "
            f"inputs (probe_golden_agreement = {min_agreement:g})"
        )
    return ""


class ProbeCache:
    """``<state_dir>/probe-cache.json``: probe results and `fastest` decisions, written atomically.

    A missing or corrupt file is an empty cache (logged), never a start-up failure: the cache
    only saves time.
    """

    def __init__(self, path: Path, max_entries: int = 1000) -> None:
        self.path = path
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._probes: dict[str, dict[str, Any]] = {}
        self._decisions: dict[str, dict[str, Any]] = {}
        self._plans: dict[str, dict[str, Any]] = {}  # execution plans (hardware.plan_search)
        self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s: unusable probe cache ignored (%s)", self.path, exc)
            return
        if not isinstance(data, dict) or data.get("format") != _CACHE_FORMAT:
            log.warning("%s: probe cache of another format ignored", self.path)
            return
        probes, decisions = data.get("probes"), data.get("decisions")
        self._probes = probes if isinstance(probes, dict) else {}
        self._decisions = decisions if isinstance(decisions, dict) else {}
        plans = data.get("plans")  # absent in caches written before plans existed
        self._plans = plans if isinstance(plans, dict) else {}

    def _prune(self, table: dict[str, dict[str, Any]]) -> None:
        """Drop the oldest entries beyond ``max_entries``: old model versions pile up otherwise."""
        excess = len(table) - self.max_entries
        if excess > 0:
            oldest = sorted(table, key=lambda key: _age_key(table[key]))
            for key in oldest[:excess]:
                del table[key]

    def _write(self) -> None:
        self._prune(self._probes)
        self._prune(self._decisions)
        self._prune(self._plans)
        payload = {
            "format": _CACHE_FORMAT,
            "probes": self._probes,
            "decisions": self._decisions,
            "plans": self._plans,
        }
        try:  # a read-only state directory costs the cache, never the agent
            write_json_atomic(self.path, payload)
        except OSError as exc:
            log.warning("%s: cannot write probe cache (%s)", self.path, exc)

    @staticmethod
    def probe_key(model_hash: str, candidate: Candidate, version: str) -> str:
        return f"{model_hash}|{candidate.key}|{candidate.runtime}@{version}"

    def get_probe(self, key: str) -> ProbeResult | None:
        with self._lock:
            entry = self._probes.get(key)
        if not isinstance(entry, dict):
            return None
        try:
            result = ProbeResult(**{**entry, "cached": True})
        except TypeError:
            return None
        if not isinstance(result.ok, bool) or not isinstance(result.at, (int, float)):
            return None  # a hand-edited or garbled entry: probe again
        return result

    def put_probe(self, key: str, result: ProbeResult) -> None:
        with self._lock:
            self._probes[key] = {**result.to_dict(), "cached": False}
            self._write()

    def latest_by_candidate(self) -> dict[tuple[str, str], ProbeResult]:
        """The newest probe of each (candidate key, runtime version), whatever the model.

        What the device has learnt about its hardware outlives the model versions it was
        learnt with: a release's download choice reads it (``Accelerators.failed_candidates``)
        so a new version of a model never fetches a variant for an accelerator that failed
        here on the same runtime version. A newer success of the candidate (another model)
        replaces an older failure.
        """
        with self._lock:
            keys = list(self._probes)
        latest: dict[tuple[str, str], ProbeResult] = {}
        for key in keys:
            result = self.get_probe(key)
            if result is None or not result.runtime_version:
                continue
            slot = (result.candidate, result.runtime_version)
            if slot not in latest or latest[slot].at <= result.at:
                latest[slot] = result
        return latest

    def get_decision(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._decisions.get(key)
        return entry if isinstance(entry, dict) else None

    def put_decision(self, key: str, decision: dict[str, Any]) -> None:
        with self._lock:
            self._decisions[key] = decision
            self._write()

    @staticmethod
    def plan_key(probe_key: str, hardware: str, request: str) -> str:
        """A plan is the probe's (model content, candidate, runtime version) on this hardware
        under these pins: a change of any is a new key, so the plan is measured again."""
        return f"{probe_key}|{hardware}|{request}"

    def get_plan(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._plans.get(key)
        return entry if isinstance(entry, dict) else None

    def put_plan(self, key: str, plan: dict[str, Any]) -> None:
        with self._lock:
            self._plans[key] = plan
            self._write()


def _age_key(entry: Any) -> float:
    at = entry.get("at") if isinstance(entry, dict) else None
    return float(at) if isinstance(at, (int, float)) else 0.0


class Prober:
    """Loads candidates through the runtime plugins, proves them with one inference, caches."""

    def __init__(
        self,
        cache: ProbeCache,
        *,
        threads: int | None,
        compiled_dir: Path,
        timeout_s: float,
        failure_ttl_s: float,
        golden_agreement: float = 0.0,
        unsealer: Unsealer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.threads = threads
        self.compiled_dir = compiled_dir
        self.timeout_s = timeout_s
        self.failure_ttl_s = failure_ttl_s
        self.golden_agreement = golden_agreement
        self.unsealer = unsealer  # opens sealed variants; None: they fail to load, clearly
        self.clock = clock
        # (candidate, error) → the first model it was said for: an accelerator's compiler error
        # is the same for every model, and is logged in full once.
        self._said: dict[tuple[str, str], str] = {}

    def with_threads(self, threads: int) -> Prober:
        """This prober loading with ``threads`` intra-op threads (one execution instance of a
        plan), sharing the cache: an instance's failover loads keep the plan's threads."""
        other = copy.copy(self)
        other.threads = threads
        return other

    def request(self, package: ModelPackage, candidate: Candidate, variant: Variant) -> LoadRequest:
        return load_request(
            package,
            variant,
            device=candidate.device,
            threads=self.threads,
            cache_dir=self.compiled_dir / candidate.runtime,
            options=dict(candidate.options),
            unsealer=self.unsealer,
        )

    def load(
        self,
        package: ModelPackage,
        candidate: Candidate,
        variant: Variant,
        *,
        model_hash: str,
        use_cache: bool = True,
    ) -> tuple[Session | None, ProbeResult]:
        """Load and run once; a fresh cached failure is returned without loading again."""
        try:
            version = installed_version(candidate.runtime)
        except RuntimeUnavailable as exc:
            return None, ProbeResult(candidate.key, False, str(exc), at=self.clock())
        key = ProbeCache.probe_key(model_hash, candidate, version)
        if use_cache:
            cached = self.cache.get_probe(key)
            if cached and not cached.ok and self.clock() - cached.at < self.failure_ttl_s:
                return None, cached
        session, result = self._load_with_timeout(package, candidate, variant, version)
        self.cache.put_probe(key, result)
        if result.ok:
            log.info("probe %s for %s: works (%.0f ms load)", candidate.key, package.name,
                     result.load_ms)  # fmt: skip
        else:  # an accelerator this board lacks is an expected answer, not a fault
            first = self._said.setdefault((candidate.key, result.error), package.name)
            if first == package.name:
                log.info("probe %s for %s: dropped: %s", candidate.key, package.name, result.error)
            else:
                log.info("probe %s for %s: dropped (the same error as for %s)", candidate.key,
                         package.name, first)  # fmt: skip
        return session, result

    def _load_with_timeout(
        self, package: ModelPackage, candidate: Candidate, variant: Variant, version: str
    ) -> tuple[Session | None, ProbeResult]:
        """Run the probe in a thread so a hung driver cannot hang the agent.

        A thread that overruns is abandoned (Python cannot kill it); if it ever finishes, it
        closes what it loaded.
        """
        outcome: dict[str, Any] = {}
        abandoned = threading.Event()

        def work() -> None:
            started = time.perf_counter()
            try:  # a sealed variant is decrypted here, its time counted as loading
                request = self.request(package, candidate, variant)
                session = get_runtime(candidate.runtime).load(request)
                del request  # the plaintext of a sealed model lives no longer than the load
            except Exception as exc:  # the plugin's RuntimeLoadError, or a driver's own error
                outcome.update(error=_describe(exc), stage="load")
                return
            loaded = time.perf_counter()
            stage = "answers"
            try:
                outputs = session.run(sample_feeds(package))
                problem = check_outputs(package, outputs)
                problem = problem or golden_problem(package, session, self.golden_agreement)
            except Exception as exc:
                problem, stage = f"loads, but inference fails: {_describe(exc)}", "run"
            finished = time.perf_counter()
            if problem or abandoned.is_set():
                session.close()
                outcome.update(error=problem, stage=stage)
                return
            outcome.update(
                session=session,
                load_ms=(loaded - started) * 1000,
                run_ms=(finished - loaded) * 1000,
            )

        thread = threading.Thread(target=work, name=f"probe-{candidate.key}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        at = self.clock()
        if thread.is_alive():
            abandoned.set()
            error = f"no answer within probe_timeout_s = {self.timeout_s:g} s (abandoned)"
            return None, ProbeResult(
                candidate.key, False, error, runtime_version=version, at=at, stage="timeout"
            )
        if "session" not in outcome:
            error = outcome.get("error") or "failed without a message"
            return None, ProbeResult(
                candidate.key,
                False,
                error,
                runtime_version=version,
                at=at,
                stage=outcome.get("stage", ""),
            )
        result = ProbeResult(
            candidate.key,
            True,
            load_ms=round(outcome["load_ms"], 3),
            run_ms=round(outcome["run_ms"], 3),
            runtime_version=version,
            at=at,
        )
        return outcome["session"], result


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 600 else text[:600] + " …"
