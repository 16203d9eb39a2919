"""The hardware façade the daemon uses: detect once, then open a resilient session per model."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from edgeagent.hardware.choose import Choice, Chooser, Option, PowerReader, is_cpu, why_not
from edgeagent.hardware.detect import Detection, detect, read_facts
from edgeagent.hardware.fallback import ResilientSession
from edgeagent.hardware.instances import InstanceGroup, Lane
from edgeagent.hardware.peers import PeerSettings, with_peers
from edgeagent.hardware.plan_search import (
    PENDING,
    MeasuredPlan,
    PlanRequest,
    PlanShape,
    SessionPool,
    fixed_shape,
    hardware_key,
)
from edgeagent.hardware.plan_search import search as search_plan
from edgeagent.hardware.probe import CACHE_FILE, ProbeCache, Prober, ProbeResult
from edgeagent.hardware.profile import Profile, board_profiles
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.hardware.spread import device_key, lane_order, pick_devices, wanted_devices
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import ModelPackage
from edgeagent.models.unsealer import Unsealer
from edgeagent.runtimes import (
    RuntimeLoadError,
    RuntimeUnavailable,
    Session,
    get_runtime,
    installed_version,
    runtime_status,
)
from edgeagent.runtimes.base import default_threads

log = logging.getLogger(__name__)

DEVICE_FAILURES = {"load", "run", "timeout"}  # ProbeResult.stage of the device's own failures


class PlanSessions(NamedTuple):
    """A variant's execution plan, the sessions of its instances, and the lone request's."""

    plan: MeasuredPlan
    sessions: list[Session]
    lone: Session | None = None


class Accelerators:
    """Board profile + probing + choice + fallback, behind three calls: open, report, profile.

    ``power_reader`` builds, for the detected profile, a reader of the board's power (watts
    averaged since its previous call, or None) that lets `fastest` mode keep to the profile's
    power budget; the daemon passes the governor's sensors, which know the profile's meters.
    ``on_demote(model, candidate)`` is told of every demotion (the daemon counts them).
    ``unsealer`` opens sealed (encrypted) variants with the device key, in memory.
    ``peers`` (``[[peer]]``) are other servers a model may also run on (``peers``).
    """

    def __init__(
        self,
        settings: HardwareSettings,
        state_dir: Path,
        *,
        power_reader: Callable[[Profile], PowerReader | None] | None = None,
        on_demote: Callable[[str, str], None] | None = None,
        unsealer: Unsealer | None = None,
        peers: Sequence[PeerSettings] = (),
    ) -> None:
        self.settings = settings
        self.peers = tuple(peers)
        self._on_demote = on_demote
        self.state_dir = Path(state_dir)
        profiles = board_profiles(settings.profiles_dir)
        self.detection: Detection = detect(profiles, read_facts(settings.root), settings.profile)
        self.profile: Profile = self.detection.profile
        threads = settings.threads or self.profile.threads
        self.prober = Prober(
            ProbeCache(self.state_dir / CACHE_FILE, settings.probe_cache_entries),
            threads=threads,
            compiled_dir=self.state_dir / "compiled",
            timeout_s=settings.probe_timeout_s,
            failure_ttl_s=settings.probe_failure_ttl_s,
            golden_agreement=settings.probe_golden_agreement,
            unsealer=unsealer,
        )
        self.chooser = Chooser(
            self.prober,
            mode=settings.choice,
            top_k=settings.fastest_top_k,
            seconds=settings.fastest_seconds,
            power_budget_w=self.profile.power_budget_w,
            power_w=power_reader(self.profile) if power_reader is not None else None,
        )
        self._lock = threading.Lock()
        self._sessions: dict[str, ResilientSession | InstanceGroup] = {}
        self._choices: dict[str, Choice] = {}

    @property
    def runtimes(self) -> dict[str, dict[str, object]]:
        """Installed runtimes; device lists only for those a candidate already imported."""
        return runtime_status(load=False)

    def choose(self, package: ModelPackage, *, use_cache: bool = True) -> Choice:
        """Probe and choose without wrapping: what ``edgeagent profile`` reports."""
        return self.chooser.choose(self.profile, package, use_cache=use_cache)

    def open(
        self, package: ModelPackage, plan: PlanRequest | None = None, *, search: bool = True
    ) -> ResilientSession | InstanceGroup:
        """Choose a candidate for ``package`` and return a session that falls back on failure.

        With ``plan``, the chosen candidate runs as the execution plan says (``plan_of``):
        an InstanceGroup of resilient sessions, one per instance; without ``search``, a plan
        not cached yet is not measured: the group runs the probe's session on a ``PENDING``
        plan, and a later ``open`` with ``search`` measures it. With a ``spread`` over
        several devices (model.toml ``[serving] spread``, else ``[hardware] spread``), every
        device's best working candidate runs as a lane of that group under its own plan
        (``spread``). Blocking (it loads and runs models): call it in a worker thread.
        RuntimeLoadError lists every candidate's reason when none works.
        """
        choice = self.choose(package)
        if choice.session is None or choice.chosen is None:
            raise RuntimeLoadError(self._none_works(package, choice))
        spread = package.serving.spread or self.settings.spread
        session: ResilientSession | InstanceGroup
        if wanted_devices(spread) != (1, None):
            request = plan or PlanRequest(auto=False)
            session = self._spread(package, choice, request, spread, search=search)
        elif plan is None:
            session = self._resilient(package, choice, choice.session, self.prober)
        else:
            planned = self.plan_of(
                package,
                choice.chosen,
                choice.session,
                plan,
                lone=plan.keeps_lone_session,
                search=search,
            )
            prober = self.prober.with_threads(planned.plan.shape.threads)
            alone = None
            if planned.lone is not None:  # the lone request's session: all the cores
                alone = self._resilient(package, choice, planned.lone, self.prober)
            session = InstanceGroup(
                [self._resilient(package, choice, s, prober) for s in planned.sessions],
                planned.plan,
                lone=alone,
            )
        grown = with_peers(package, session, self.peers)  # lanes on peers that may take it
        session = grown if isinstance(grown, InstanceGroup) else session
        with self._lock:
            self._sessions[f"{package.name}:{package.version}"] = session
            self._choices[f"{package.name}:{package.version}"] = choice
        return session

    def _none_works(self, package: ModelPackage, choice: Choice) -> str:
        reasons = "; ".join(f"{o.key}: {why_not(choice, o)}" for o in choice.options)
        return f"no candidate of profile {self.profile.name} runs {package.name}: {reasons}"

    def _spread(
        self,
        package: ModelPackage,
        choice: Choice,
        request: PlanRequest,
        spread: int | Sequence[str],
        *,
        search: bool = True,
    ) -> InstanceGroup:
        """One lane per device (``spread.pick_devices``), each its own plan and instances,
        each instance a resilient session failing over within its device first; without
        ``search``, a lane whose plan is not cached serves pending on its first session."""
        model_hash = package.content_hash()

        def load(option: Option) -> tuple[Session | None, ProbeResult]:
            assert option.variant is not None
            return self.prober.load(
                package, option.candidate, option.variant, model_hash=model_hash
            )

        picked = pick_devices(choice, spread, load)
        if not picked:
            raise RuntimeLoadError(
                f"no device of spread {spread!r} runs {package.name} (devices of profile "
                f"{self.profile.name}: {', '.join(self._devices()) or 'none'}): "
                + self._none_works(package, choice)
            )
        group = {device_key(option.candidate) for option, _ in picked}
        order = choice.fallback_order()
        lanes = []
        for option, first in picked:
            planned = self.plan_of(package, option, first, request, search=search)
            prober = self.prober.with_threads(planned.plan.shape.threads)
            fallback = lane_order(order, option, group)
            resilient = [
                self._resilient(package, choice, s, prober, option, fallback)
                for s in planned.sessions
            ]
            lanes.append(Lane(device_key(option.candidate), planned.plan, resilient))
        log.info("%s spread over %s", package.name, ", ".join(
            f"{lane.device} ({lane.plan.shape.label})" for lane in lanes))  # fmt: skip
        return InstanceGroup(lanes[0].sessions, lanes[0].plan, lanes[1:])

    def _devices(self) -> list[str]:
        """The profile's devices, by key, in ranking order: what a spread list may name."""
        return list(dict.fromkeys(device_key(c) for c in self.profile.candidates))

    def _resilient(
        self,
        package: ModelPackage,
        choice: Choice,
        session: Session,
        prober: Prober,
        option: Option | None = None,
        order: Sequence[Option] | None = None,
    ) -> ResilientSession:
        """A resilient session starting on ``session`` (the choice's pick unless ``option``),
        failing over along ``order`` (the choice's fallback order unless given)."""
        option = option or choice.chosen
        assert option is not None
        return ResilientSession(
            package,
            order or choice.fallback_order(),
            prober,
            self.settings,
            model_hash=package.content_hash(),
            initial=(option, session),
            results=choice.results,
            on_demote=self._on_demote,
        )

    def plan_of(
        self,
        package: ModelPackage,
        chosen: Option,
        session: Session,
        request: PlanRequest,
        *,
        use_cache: bool = True,
        lone: bool = False,
        search: bool = True,
    ) -> PlanSessions:
        """The execution plan of one candidate (``chosen``, proven by ``session``) and the
        sessions of its instances; with ``lone``, also a session of all the cores when the
        plan's instances have fewer threads (a request alone runs there: c=1 latency).

        Configured (``request.auto`` false), cached (the same model content, candidate, runtime
        version, hardware and pins), or measured now (``plan_search.search``, within
        ``request.search_s`` whatever the model's speed) and cached; without ``search``, one
        not cached is the configured shape on ``session`` alone, ``PENDING`` its search.
        ``session`` is one of the pool's and serves when the plan's threads match it. A search
        that fails (a batch the runtime refuses) serves the configured shape.
        """
        assert chosen.variant is not None
        variant, candidate = chosen.variant, chosen.candidate
        cores = self.prober.threads or default_threads()
        probe_key = ProbeCache.probe_key(
            package.content_hash(), candidate, installed_version(candidate.runtime)
        )
        key = ProbeCache.plan_key(
            probe_key, hardware_key(self.profile.name, cores), request.fingerprint
        )
        runtime = get_runtime(candidate.runtime)
        pool = SessionPool(
            lambda t: runtime.load(self.prober.with_threads(t).request(package, candidate, variant))
        )
        pool.add(cores, session)
        fixed = MeasuredPlan(fixed_shape(cores, request), "fixed", cores, at=time.time())
        plan = None
        if request.auto and use_cache:
            cached = self.prober.cache.get_plan(key)
            plan = MeasuredPlan.from_dict(cached) if cached is not None else None
        if plan is None and request.auto and not search:
            pending = PlanShape(1, cores, fixed.shape.batch)  # the probe's session alone
            plan = MeasuredPlan(pending, PENDING, cores, at=time.time())
        if plan is None and request.auto:
            probed = self.prober.cache.get_probe(probe_key)
            load_s = probed.load_ms / 1e3 if probed is not None and probed.ok else None
            try:
                plan = search_plan(pool, sample_feeds(package), cores, request, load_s=load_s)
            except Exception as exc:  # the pool's sessions stay; the configured shape serves
                log.warning("%s: execution plan search failed (%s); serving %s", package.name,
                            exc, fixed.shape.label)  # fmt: skip
            else:
                if plan.source == "search":
                    self.prober.cache.put_plan(key, plan.to_dict())
                    log.info("%s: execution plan %s (%.0f rows/s) in %.0f ms", package.name,
                             plan.shape.label, plan.rows_per_s or 0, plan.search_ms)  # fmt: skip
        plan = plan or fixed
        try:
            sessions, alone = pool.keep(plan.shape, cores if lone else None)
        except Exception:
            pool.close()
            raise
        return PlanSessions(plan, sessions, alone)

    def failed_candidates(self, memory_s: float = 0.0) -> set[str]:
        """Candidate keys a release's variant is not worth downloading for
        (``choose.release_variants``): those unavailable for a model served now, and — with
        ``memory_s`` — every accelerator whose latest probe here, for any model or version,
        failed on the runtime version installed now within ``memory_s`` seconds.

        Only accelerators are remembered across models, and only failures of the device
        (load, first run, time-out): a CPU candidate works wherever its runtime does, and
        wrong answers are one variant's fault, which the next version may not share. A new
        runtime version forgets them all (its probes start afresh); a later success of the
        candidate forgets its failure.
        """
        with self._lock:
            sessions = [s for s in self._sessions.values() if not s.closed]
        failed = {
            entry["candidate"]
            for session in sessions
            for entry in session.status()["candidates"]
            if entry["state"] == "unavailable"
        }
        return failed | self._remembered_failures(memory_s) if memory_s > 0 else failed

    def _remembered_failures(self, memory_s: float) -> set[str]:
        accelerators = {c.key: c for c in self.profile.candidates if not is_cpu(c)}
        versions: dict[str, str | None] = {}
        now = time.time()
        remembered = set()
        for (key, version), result in self.prober.cache.latest_by_candidate().items():
            candidate = accelerators.get(key)
            if candidate is None or result.ok or result.stage not in DEVICE_FAILURES:
                continue
            if candidate.runtime not in versions:
                try:
                    versions[candidate.runtime] = installed_version(candidate.runtime)
                except RuntimeUnavailable:
                    versions[candidate.runtime] = None
            if version == versions[candidate.runtime] and now - result.at < memory_s:
                remembered.add(key)
        return remembered

    def report(self) -> dict[str, Any]:
        """JSON-able state for /v1/status: board, profile, runtimes and each model's accelerator."""
        with self._lock:  # a version the registry closed is gone from the report
            for key in [k for k, session in self._sessions.items() if session.closed]:
                del self._sessions[key], self._choices[key]
            sessions = dict(self._sessions)
            choices = dict(self._choices)
        models = {}
        for key, session in sessions.items():
            status = session.status()
            status["choice"] = {"mode": choices[key].mode, "reason": choices[key].reason}
            status["latency_ms"] = choices[key].latency_ms
            models[key] = status
        return {
            **self.detection.report(),
            "choice_mode": self.settings.choice,
            "runtimes": self.runtimes,
            "models": models,
        }
