"""The model registry: which model versions are loaded, which one takes traffic, hot swap.

Loading is always "open → warm → route": a new version takes requests only after its session
answered one inference, and the version it replaces keeps answering what it already queued
before its session is closed (MLServer's registry does the same), so an update or a reload
never fails a request. Sessions are opened by an ``opener`` (the hardware façade's
``Accelerators.open``: probe, choose, fallback); the registry never picks a runtime itself.
Nor does it build what serves a session: a ``build`` callable (``serving.ModelFactory``) wraps
each warmed session, and ``on_model_load`` / ``on_model_unload`` hooks (gauges, as MLServer's
registry has them) see every version come and go. Lookups change no model's state: a canary is
judged after each of its requests finishes, not inside ``get()`` (the judgement itself lives in
``engine.canary_judge``; whoever starts a canary awaits its verdict there).

A little over 500 lines, on purpose: loading, routing, the canary's place beside the active
version and unloading all change one model's entry under that entry's lock, and the "open →
warm → route" order is only visible when those moves are read together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeagent.aio import spawn
from edgeagent.engine.canary_judge import PROMOTED, Canary, CanaryPolicy, CanaryVerdict
from edgeagent.engine.errors import LoadFailed, ModelNotFound, NotReady
from edgeagent.engine.serving import LoadedModel
from edgeagent.engine.settings import EngineSettings
from edgeagent.heap import release_free_memory
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import ModelPackage, PackageError, load_package, version_tuple
from edgeagent.runtimes.base import Session, is_managed

log = logging.getLogger(__name__)

READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
LOADING_RETRY_S = 1  # the Retry-After of a request to a model still loading

Opener = Callable[[ModelPackage], Session]
# The session of a package under its measured execution plan (blocking: it searches); the
# registry calls it, in the background, for a version that serves on a pending plan.
Planner = Callable[[ModelPackage], Session]
# Where a model not yet known may be found by name (the models directory); None = nowhere.
Locator = Callable[[str], Path | None]
Builder = Callable[..., LoadedModel]  # ModelFactory.build(package, session, stats=None)
ModelHook = Callable[[LoadedModel], None]
Check = Callable[[LoadedModel], Awaitable[None]]  # raises when the version must not serve


@dataclass
class _Entry:
    """Everything the registry knows about one model name."""

    name: str
    source: Path  # the package directory load(name) reads
    state: str = UNAVAILABLE
    reason: str = "not loaded"
    active: LoadedModel | None = None
    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    canary: Canary | None = None
    canary_outcome: str = ""  # the last canary's verdict, for status


class ModelRegistry:
    """Loaded models by name and version (see the module docstring)."""

    def __init__(
        self,
        opener: Opener,
        build: Builder,
        *,
        settings: EngineSettings,
        executor: Executor,
        on_model_load: Iterable[ModelHook] = (),
        on_model_unload: Iterable[ModelHook] = (),
        locate: Locator | None = None,
        plan: Planner | None = None,
    ) -> None:
        """``build`` wraps a warmed session for serving; the hooks see every version that
        starts serving and every one that stopped (metrics, status), as MLServer's do.
        ``locate`` finds a package by name for ``load`` of a model added after start.
        ``plan`` opens a version again under its measured plan (``_search_plan``)."""
        self._locate = locate
        self._plan = plan
        self._searches: set[asyncio.Task] = set()
        self._search_slot = asyncio.Lock()  # one search at a time: two would time each other
        self._stopping = False
        self._opener = opener
        self._build = build
        self._settings = settings
        self._executor = executor
        self._on_load = list(on_model_load)
        self._on_unload = list(on_model_unload)
        self._entries: dict[str, _Entry] = {}
        self._closing: set[asyncio.Task] = set()  # versions retired in the background

    # ---- discovery -------------------------------------------------------------------------

    def add(self, package_dir: Path) -> str:
        """Make a package directory known under its name (not loaded yet); returns the name.

        An invalid package is still listed, as UNAVAILABLE with the validation error as reason,
        so that the repository index shows an operator what is wrong.
        """
        try:
            name = load_package(package_dir).name
            reason = "not loaded"
        except PackageError as exc:
            name, reason = Path(package_dir).name, f"invalid package: {exc}"
        entry = self._entries.setdefault(name, _Entry(name, Path(package_dir)))
        entry.source = Path(package_dir)
        if entry.active is None:
            entry.reason = reason
        return name

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    # ---- lookup ----------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """The version that takes traffic (or the one asked for); 404 / 503 with the reason.

        A lookup changes no model's state: a running canary only counts it to keep its share
        of the traffic; it is judged when its requests finish (``_judge``).
        """
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self.names) or "none"
            raise ModelNotFound(f"unknown model {name!r} (models: {known})")
        if version is not None:
            model = entry.loaded.get(version)
            if model is None:
                loaded = ", ".join(self.versions(name)) or "none"
                raise ModelNotFound(f"model {name!r} has no version {version!r} (loaded: {loaded})")
            return model
        if entry.active is None:
            raise _not_ready(entry)
        canary = entry.canary
        if canary is not None and canary.takes_next():
            return canary.model
        return entry.active

    def versions(self, name: str) -> list[str]:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model {name!r}")
        return sorted(entry.loaded, key=version_tuple)

    def index(self) -> list[dict[str, str]]:
        """The v2 repository index: one row per loaded version, one per model not loaded."""
        rows = []
        for name, entry in sorted(self._entries.items()):
            if entry.loaded and entry.state == READY:
                rows += [
                    {"name": name, "version": v, "state": READY, "reason": ""}
                    for v in self.versions(name)
                ]
            else:
                version = entry.active.version if entry.active else ""
                rows.append(
                    {"name": name, "version": version, "state": entry.state, "reason": entry.reason}
                )
        return rows

    def status(self) -> dict:
        """The "models" part of /v1/status."""
        result = {}
        for name, entry in sorted(self._entries.items()):
            result[name] = {
                "state": entry.state,
                "reason": entry.reason,
                "active_version": entry.active.version if entry.active else None,
                "canary": (
                    {
                        "version": entry.canary.model.version,
                        "share": entry.canary.policy.share,
                        "requests_and_faults": entry.canary.counts(),
                    }
                    if entry.canary
                    else None
                ),
                "last_canary": entry.canary_outcome,
                "versions": {
                    version: {
                        **model.backend,
                        "queued": model.queued,
                        "plan": model.plan.to_dict(),
                        "session": _session_status(model.session),
                        "traffic": model.stats.traffic(),
                    }
                    for version, model in sorted(entry.loaded.items())
                },
            }
        return result

    # ---- lifecycle -------------------------------------------------------------------------

    async def load(self, name: str) -> LoadedModel:
        """Load ``name`` from its package directory; no-op when it already serves.

        A name not known yet is looked for with ``locate`` (the models directory), so a
        package copied in after start can be loaded without a restart, as Triton's explicit
        model control does.
        """
        entry = self._entries.get(name) or self._discover(name)
        if entry is None:
            raise ModelNotFound(f"unknown model {name!r} (models: {', '.join(self.names)})")
        if entry.active is not None:
            return entry.active
        return await self.activate(entry.source)

    def _discover(self, name: str) -> _Entry | None:
        """The entry of a package ``locate`` finds under ``name``, added now; None if none.

        The directory's name is the one asked for; the package inside must carry that name
        too, or an operator loading ``a`` would start serving some ``b``.
        """
        directory = self._locate(name) if self._locate is not None else None
        if directory is None:
            return None
        try:
            found = load_package(directory).name
        except PackageError:
            found = name  # listed under its directory's name, with the reason, by add()
        if found != name:
            raise LoadFailed(
                f"{directory}: the package there is named {found!r}, not {name!r}: rename the "
                "directory or the model.toml name"
            )
        self.add(directory)
        return self._entries[name]

    async def activate(self, package_dir: Path, *, keep_previous: bool = False) -> LoadedModel:
        """Hot swap: open and warm the package, route new requests to it, retire the old one.

        The old version finishes what it queued before its session closes, and a request that
        still reaches it is passed on to the new one, so no request fails. With
        ``keep_previous`` the old version stays loaded, addressable by its version.
        Raises LoadFailed (the old version keeps serving) when the package cannot be used.
        """
        try:
            package = load_package(package_dir)
        except PackageError as exc:
            raise LoadFailed(f"cannot load {package_dir}: {exc}") from exc
        entry = self._entries.setdefault(package.name, _Entry(package.name, Path(package_dir)))
        async with entry.lock:
            if entry.active is None:
                entry.state, entry.reason = LOADING, f"loading version {package.version}"
            try:
                model = await self._open(package)
            except Exception as exc:
                if entry.active is None:
                    entry.state, entry.reason = UNAVAILABLE, str(exc)
                raise
            entry.source = Path(package_dir)
            candidates = [entry.loaded.get(model.version)]  # the same version, reloaded
            if not keep_previous:
                candidates.append(entry.active)
            if entry.canary is not None:  # an explicit activation ends any canary
                candidates.append(entry.canary.model)
                self._interrupt(entry, f"version {model.version} was activated")
            retiring = [m for m in dict.fromkeys(candidates) if m is not None and m is not model]
            entry.loaded[model.version] = model
            entry.active = model
            entry.state, entry.reason = READY, ""
            for previous in retiring:
                previous.successor = model
                if entry.loaded.get(previous.version) is previous:
                    del entry.loaded[previous.version]
            log.info("model %s: version %s serves on %s", model.name, model.version, model.backend)
        self._plan_later(entry, model)
        for previous in retiring:
            await self._close(previous)
        return model

    async def canary(
        self,
        package_dir: Path,
        policy: CanaryPolicy | None = None,
        *,
        check: Check | None = None,
    ) -> Canary:
        """Load a new version beside the active one and send it ``policy.share`` of the traffic.

        ``check`` (the updater's golden check) runs on the loaded version before any traffic
        reaches it; when it raises, the version is closed and the error propagates. The
        canary is then judged on its requests (``edgeagent.engine.canary_judge``): promoted — it
        becomes the active version, the old one retires as in ``activate`` — or rolled back.
        Await ``outcome()`` of the returned canary for the verdict. Requests that name a
        version are never redirected. Raises LoadFailed when it cannot load.
        """
        policy = policy or CanaryPolicy.from_settings(self._settings)
        try:
            package = load_package(package_dir)
        except PackageError as exc:
            raise LoadFailed(f"cannot load {package_dir}: {exc}") from exc
        entry = self._entries.get(package.name)
        if entry is None or entry.active is None:
            raise LoadFailed(f"model {package.name!r} has no active version to compare with")
        if package.version in entry.loaded:
            raise LoadFailed(f"model {package.name!r} version {package.version} is already loaded")
        async with entry.lock:
            model = await self._open(package)
            try:
                if check is not None:
                    await check(model)
            except BaseException:
                await self._close(model)
                raise
            if entry.active is None:  # unloaded while it loaded or was checked
                await self._close(model)
                raise LoadFailed(f"model {package.name!r} was unloaded while its canary loaded")
            previous = entry.canary
            if previous is not None:
                self._interrupt(entry, f"superseded by version {model.version}")
                self._retire(entry, previous.model, entry.active, "superseded by a newer canary")
            entry.loaded[model.version] = model
            canary = entry.canary = Canary(model, entry.active, policy)
            model.on_request_done.append(lambda: self._judge(entry, canary))
            canary.timer = asyncio.get_running_loop().call_later(
                policy.max_seconds, self._time_out, entry, canary
            )
            log.info(
                "model %s: canary %s takes %.0f%%", model.name, model.version, policy.share * 100
            )
        return canary

    def canary_policy(self, **overrides: Any) -> CanaryPolicy:
        """The ``[server] canary_*`` defaults with ``overrides`` (a release's own values)."""
        return CanaryPolicy.from_settings(self._settings, **overrides)

    def _judge(self, entry: _Entry, canary: Canary) -> None:
        """After each canary request: conclude the canary once the evidence suffices."""
        if entry.canary is not canary or entry.active is None:
            return  # already concluded, superseded, or the model was unloaded
        verdict = canary.judge(entry.active)
        if verdict is not None:
            self._conclude(entry, canary, verdict)

    def _time_out(self, entry: _Entry, canary: Canary) -> None:
        """``max_seconds`` passed: conclude on what was seen (``Canary.time_out``)."""
        if entry.canary is canary and entry.active is not None:
            self._conclude(entry, canary, canary.time_out(entry.active))

    def _conclude(self, entry: _Entry, canary: Canary, verdict: CanaryVerdict) -> None:
        """Act on the verdict (promote or roll back), then resolve the canary's outcome."""
        entry.canary = None
        stable = entry.active
        assert stable is not None  # callers check; a canary never outlives its stable version
        version = canary.model.version
        if verdict.outcome == PROMOTED:
            entry.active = canary.model
            entry.source = canary.model.package.root
            self._retire(entry, stable, canary.model, "promoted")
            log.info("model %s: canary %s promoted: %s", entry.name, version, verdict.summary())
            entry.canary_outcome = f"version {version} promoted"
            self._plan_later(entry, canary.model)
        else:
            self._retire(entry, canary.model, stable, f"rolled back: {verdict.reason}")
            log.warning("model %s: canary %s rolled back: %s", entry.name, version, verdict.reason)
            entry.canary_outcome = f"version {version} rolled back: {verdict.reason}"
        canary.resolve(verdict)

    def _interrupt(self, entry: _Entry, why: str) -> None:
        """End the running canary without a verdict (its model is retired by the caller)."""
        canary = entry.canary
        if canary is None:
            return
        entry.canary = None
        entry.canary_outcome = f"version {canary.model.version} interrupted: {why}"
        canary.resolve(canary.interrupted(why))

    def _retire(self, entry: _Entry, model: LoadedModel, successor: LoadedModel, why: str) -> None:
        """Stop routing to ``model`` now; it drains and closes in the background."""
        model.successor = successor
        if entry.loaded.get(model.version) is model:
            del entry.loaded[model.version]
        log.info("model %s: version %s retired (%s)", entry.name, model.version, why)
        task = spawn(self._close(model), name=f"close:{entry.name}:{model.version}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def unload(self, name: str) -> None:
        """Stop routing to ``name``, drain its versions, close their sessions; it stays listed."""
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model {name!r} (models: {', '.join(self.names)})")
        async with entry.lock:
            models = list(entry.loaded.values())
            entry.state, entry.reason = UNLOADING, "unloading"
            entry.active = None
            self._interrupt(entry, "the model was unloaded")
            entry.loaded.clear()
            await asyncio.gather(*(self._close(m) for m in models))
            entry.state, entry.reason = UNAVAILABLE, "unloaded"
        if models:  # the runtimes' arenas are freed: hand the pages back to the system
            await asyncio.get_running_loop().run_in_executor(self._executor, release_free_memory)

    async def load_all(self) -> None:
        """Load every known model; one that fails is UNAVAILABLE with its reason, not fatal."""
        for name in self.names:
            try:
                await self.load(name)
            except Exception as exc:
                log.error("model %s is unavailable: %s", name, exc)

    async def close(self) -> None:
        """Drain and close every model (daemon shutdown); a search under way finishes first
        (it runs on a worker thread) and its sessions are closed unused."""
        self._stopping = True  # a search waiting for its turn stops; a running one ends
        await asyncio.gather(*(self.unload(name) for name in self.names))
        await asyncio.gather(*self._searches, return_exceptions=True)
        await asyncio.gather(*self._closing)

    async def plans_settled(self) -> None:
        """Wait until no execution-plan search is under way or waiting (tests, benchmarks)."""
        while self._searches:
            await asyncio.gather(*self._searches, return_exceptions=True)

    # ---- the execution plan, measured after a version serves ---------------------------------

    def _plan_later(self, entry: _Entry, model: LoadedModel) -> None:
        """Search ``model``'s plan in the background when it serves on a pending one."""
        if self._plan is None or not model.plan.pending:
            return
        task = spawn(self._search_plan(entry, model), name=f"plan:{entry.name}:{model.version}")
        self._searches.add(task)
        task.add_done_callback(self._searches.discard)

    async def _search_plan(self, entry: _Entry, model: LoadedModel) -> None:
        """Open the version under its measured plan, then hot swap it in for the pending one.

        The version served at once on the probe's session (a plan that is safe, not measured:
        a search takes its whole budget and, searched at start, kept every model LOADING that
        long); it keeps serving while the search measures on a worker thread, one search at a
        time. The swap is ``activate``'s: the pending version finishes what it queued, then
        closes. Nothing is swapped when the version stopped serving meanwhile (replaced,
        unloaded, a rolled-back canary) or the search failed (the safe plan serves on).
        The pages the pending session and the search freed go back to the system.
        """
        assert self._plan is not None
        loop = asyncio.get_running_loop()
        async with self._search_slot:
            if self._stopping or entry.loaded.get(model.version) is not model:
                return
            try:
                session = await loop.run_in_executor(self._executor, self._plan, model.package)
            except Exception as exc:
                log.warning("model %s: version %s keeps its safe plan: the search failed: %s",
                            entry.name, model.version, exc)  # fmt: skip
                return
        async with entry.lock:
            if entry.loaded.get(model.version) is not model:
                await loop.run_in_executor(self._executor, session.close)
                return
            # The same version: its statistics (v2 statistics, a canary's marks) carry on.
            searched = self._build(model.package, session, stats=model.stats)
            for hook in self._on_load:
                hook(searched)
            entry.loaded[model.version] = searched
            if entry.active is model:
                entry.active = searched
            model.successor = searched
            log.info("model %s: version %s serves on its measured execution plan",
                     entry.name, model.version)  # fmt: skip
        await self._close(model)
        # The pending session and the search's scratch are freed: hand the pages back.
        await loop.run_in_executor(self._executor, release_free_memory)

    # ---- internals -------------------------------------------------------------------------

    async def _open(self, package: ModelPackage) -> LoadedModel:
        """Open a session (blocking: on a worker thread), warm it, wrap it for serving."""
        loop = asyncio.get_running_loop()
        try:
            session = await loop.run_in_executor(self._executor, self._opener, package)
        except Exception as exc:
            raise LoadFailed(f"model {package.name!r} version {package.version}: {exc}") from exc
        try:
            if self._settings.warmup:
                await loop.run_in_executor(self._executor, _warm, session, package)
        except Exception as exc:
            await loop.run_in_executor(self._executor, session.close)
            raise LoadFailed(
                f"model {package.name!r} version {package.version} failed its warm-up "
                f"inference: {exc}"
            ) from exc
        model = self._build(package, session)
        for hook in self._on_load:
            hook(model)
        return model

    async def _close(self, model: LoadedModel) -> None:
        """Drain and release one version, then tell the unload hooks it is gone."""
        await model.close(self._settings.drain_timeout_s)
        for hook in self._on_unload:
            hook(model)


def _not_ready(entry: _Entry) -> NotReady:
    """The 503 of a model that does not serve, saying how to wait when waiting helps: a model
    that is LOADING serves within seconds (the probe and a warm-up; its plan is measured
    afterwards), so the client is told to retry, and where to poll."""
    if entry.state != LOADING:
        return NotReady(f"model {entry.name!r} is {entry.state}: {entry.reason}")
    return NotReady(
        f"model {entry.name!r} is LOADING ({entry.reason}) and answers once READY: retry after "
        f"{LOADING_RETRY_S} s, or poll GET /v2/models/{entry.name}/ready until it answers 200 "
        "(edgeagent status shows the state)",
        retry_after=LOADING_RETRY_S,
    )


def _warm(session: Session, package: ModelPackage) -> None:
    """One inference on the sample feeds: first-run allocations and JIT happen before traffic."""
    session.run(sample_feeds(package))


def _session_status(session: Session) -> dict:
    return session.status() if is_managed(session) else {}
