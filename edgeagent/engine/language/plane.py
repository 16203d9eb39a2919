"""The language plane: what the OpenAI and Ollama routes call, whatever runtime serves.

It owns the loaded language models (one ``Scheduler`` per model, over the session the
placement chose) and makes every decision a transport must not: the chat template, token
limits, sampling checks, refusals before any chunk (404 unknown model, 400 bad request or a
prompt longer than the context, 429 queue full, 503 loading or shed). A new version of a
model loads beside the old one and takes the name when it is ready; the old one finishes
what it runs (``[server] drain_timeout_s``) and closes, as the tensor registry swaps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry

from edgeagent.aio import spawn
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import InvalidInput, LoadFailed, ModelNotFound, NotReady
from edgeagent.engine.gate import DeviceGate, LimitsProvider
from edgeagent.engine.language.chat import render_chat
from edgeagent.engine.language.loading import NoCandidate, Placed, place
from edgeagent.engine.language.metrics import LanguageMetrics
from edgeagent.engine.language.scheduler import Scheduler
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.limits import UNTHROTTLED
from edgeagent.engine.settings import EngineSettings
from edgeagent.engine.text_requests import (
    Embeddings,
    Generation,
    GenerationRequest,
    LanguageModelInfo,
    Sampling,
)
from edgeagent.models.package import ModelPackage, PackageError, file_sha256, load_package
from edgeagent.models.text_golden import Replay, TextGolden, answer_all
from edgeagent.runtimes.generative import GenerativeSession

log = logging.getLogger(__name__)
INLINE_CHARACTERS = 16_384  # prompts rendered and tokenized on the event loop, up to this
MAX_STOP = 16  # stop strings a request may give
MAX_STOP_CHARS = 256  # each is matched against held-back text after every token


@dataclass
class _Loaded:
    package: ModelPackage
    placed: Placed
    scheduler: Scheduler
    info: LanguageModelInfo


@dataclass
class _Staged:
    package: ModelPackage
    placed: Placed
    digest: str


class LanguagePlane:
    """Every served language model, by name; one version each (a new one swaps in)."""

    def __init__(
        self,
        settings: LanguageSettings,
        *,
        engine: EngineSettings | None = None,
        metrics: CollectorRegistry | LanguageMetrics | None = None,
        gate: DeviceGate | None = None,
        limits: LimitsProvider = lambda: UNTHROTTLED,
        load: LoadCounter | None = None,
    ) -> None:
        self.settings = settings
        self._engine = engine or EngineSettings()
        if not isinstance(metrics, LanguageMetrics):
            metrics = LanguageMetrics(metrics or CollectorRegistry())
        self._metrics = metrics
        self._gate = gate or DeviceGate()
        self._limits = limits
        self._load = load or LoadCounter()
        self._models: dict[str, _Loaded] = {}
        self._loading: dict[str, str] = {}  # name → version being loaded
        self._failed: dict[str, str] = {}  # name → why its last load failed
        self._draining: set[asyncio.Task[None]] = set()
        self._staged: dict[str, _Staged] = {}  # placed for the updater's check, not serving

    # ---- what transports call ------------------------------------------------------------

    def models(self) -> list[LanguageModelInfo]:
        return [loaded.info for loaded in self._models.values()]

    def info(self, name: str) -> LanguageModelInfo:
        return self._get(name).info

    def package(self, name: str) -> ModelPackage:
        """The package of the version serving ``name`` (the updater's health check reads it)."""
        return self._get(name).package

    def _get(self, name: str) -> _Loaded:
        loaded = self._models.get(name)
        if loaded is not None:
            return loaded
        if name in self._loading:
            raise NotReady(f"language model {name!r} is loading", retry_after=5)
        if name in self._failed:
            raise NotReady(f"language model {name!r} failed to load: {self._failed[name]}")
        served = ", ".join(sorted(self._models)) or "none"
        raise ModelNotFound(f"no language model {name!r} (served: {served})")

    async def generate(self, request: GenerationRequest) -> Generation:
        """A running generation; every refusal is raised here, before any chunk."""
        loaded = self._get(request.model)
        if loaded.package.task != "text-generation":
            raise InvalidInput(
                f"model {request.model!r} is an embedding model: it generates no text"
            )
        scheduler = loaded.scheduler
        if (request.messages is None) == (request.prompt is None):
            raise InvalidInput("give either messages (a chat) or a prompt, not both or neither")
        sampling = request.sampling
        max_tokens = self._max_tokens(sampling)
        _check_sampling(sampling)
        if _characters(request) <= INLINE_CHARACTERS:  # microseconds: at once, on the loop
            prompt = _prompt(scheduler.session, request)
        else:  # milliseconds or more: on the session's own thread, which a swap closes it on
            prompt = await scheduler.run(_prompt, scheduler.session, request)
        if not prompt:
            raise InvalidInput("the prompt is empty")
        context = scheduler.sequence_context
        if len(prompt) >= context:
            raise InvalidInput(
                f"the prompt is {len(prompt)} tokens but the context of model "
                f"{request.model!r} is {context} tokens (prompt and answer together; [llm] context)"
            )
        max_tokens = min(max_tokens, context - len(prompt))
        return await scheduler.submit(
            prompt, sampling, max_tokens, request.priority, request.timeout_s
        )

    def _max_tokens(self, sampling: Sampling) -> int:
        if sampling.max_tokens is None:
            return self.settings.default_max_tokens
        if not 1 <= sampling.max_tokens <= self.settings.max_tokens:
            raise InvalidInput(
                f"max_tokens: {sampling.max_tokens} is not between 1 and the agent's cap of "
                f"{self.settings.max_tokens} ([llm] max_tokens)"
            )
        return sampling.max_tokens

    async def embed(self, model: str, inputs: Sequence[str]) -> Embeddings:
        loaded = self._get(model)
        if loaded.package.task != "embedding":
            raise InvalidInput(
                f"model {model!r} is a {loaded.package.task} model, not an embedding model"
            )
        if not inputs:
            raise InvalidInput("input: at least one text is required")
        session = loaded.scheduler.session
        vectors, count = [], 0
        for index, text in enumerate(inputs):
            tokens = await loaded.scheduler.run(partial(session.tokenize, add_special=True), text)
            if not tokens or len(tokens) > loaded.scheduler.sequence_context:
                raise InvalidInput(
                    f"input[{index}]: {len(tokens)} tokens; 1 to "
                    f"{loaded.scheduler.sequence_context} are accepted"
                )
            count += len(tokens)
            vector = await loaded.scheduler.run(session.embed, tokens)
            vectors.append(tuple(float(v) for v in vector))
        return Embeddings(tuple(vectors), count)

    def status(self) -> dict:
        """For /v1/status and ``edgeagent status``: each model's sequences and KV cache."""
        models = {
            name: {
                "version": loaded.package.version,
                "state": "READY",
                "runtime": loaded.placed.runtime,
                "variant": loaded.placed.variant.key,
                "probe_tokens_per_s": round(loaded.placed.tokens_per_s, 1),
                **loaded.scheduler.status(),
            }
            for name, loaded in self._models.items()
        }
        for name, version in self._loading.items():
            models.setdefault(name, {"version": version, "state": "LOADING"})
        for name, reason in self._failed.items():
            models.setdefault(name, {"state": "FAILED", "error": reason})
        return {"models": models}

    # ---- loading, swapping, unloading -------------------------------------------------------

    def serves(self, directory: Path) -> bool:
        """Whether the package in ``directory`` is the version already served."""
        try:
            package = load_package(directory)
        except Exception:
            return False
        loaded = self._models.get(package.name)
        return loaded is not None and loaded.package.version == package.version

    async def load(self, directory: Path) -> LanguageModelInfo:
        """Load (or hot-swap to) the package in ``directory``; LoadFailed says why."""
        package = await self._read(directory)
        staged = self._staged.pop(package.name, None)
        if staged is not None and staged.package.version == package.version:
            placed, digest = staged.placed, staged.digest  # checked, now it serves
        else:
            if staged is not None:
                await asyncio.to_thread(staged.placed.session.close)
            placed, digest = await self._place(package)
        scheduler = Scheduler(
            placed.session,
            model=package.name,
            settings=self.settings,
            stop=package.text.stop if package.text else (),
            gate=self._gate,
            limits=self._limits,
            load=self._load,
            metrics=self._metrics,
            timeout_s=self._engine.request_timeout_s,
            default_priority=self._engine.default_priority,
        )
        scheduler.start()
        info = _info(package, placed, scheduler, digest)
        old = self._models.get(package.name)
        self._models[package.name] = _Loaded(package, placed, scheduler, info)
        self._failed.pop(package.name, None)
        if old is not None:  # it finishes what it runs, new requests go to the new version
            log.info("%s: %s replaces %s", package.name, package.version, old.package.version)
            self._drain(old)
        return info

    async def _read(self, directory: Path) -> ModelPackage:
        package = await asyncio.to_thread(load_package, directory)
        if package.text is None:
            raise LoadFailed(
                f"{directory}: {package.name} is a {package.task} model, not a language model"
            )
        return package

    async def _place(self, package: ModelPackage) -> tuple[Placed, str]:
        self._loading[package.name] = package.version
        try:
            placed = await asyncio.to_thread(place, package, self.settings)
            digest = await asyncio.to_thread(_digest, placed)
        except NoCandidate as exc:
            self._failed[package.name] = str(exc)
            raise LoadFailed(str(exc)) from exc
        finally:
            self._loading.pop(package.name, None)
        return placed, digest

    # ---- a release checked on the copy that will serve it ----------------------------------

    async def stage(self, directory: Path) -> ModelPackage:
        """Place the package in ``directory`` without serving it: the updater replays its
        golden chats on this copy (``replay_staged``), and ``load`` of the same version then
        serves it as it is, so a board never holds a second copy just for the check. The
        version serving ``name`` meanwhile is untouched. LoadFailed says why it cannot."""
        package = await self._read(directory)
        await self.discard_staged(package.name)
        placed, digest = await self._place(package)
        self._failed.pop(package.name, None)
        self._staged[package.name] = _Staged(package, placed, digest)
        return package

    async def replay_staged(self, name: str, golden: TextGolden) -> tuple[str, Replay]:
        """The golden chats, greedily, on the staged copy of ``name`` (nothing else drives it:
        its first sequence, the decode timed alone); the key of the variant placed."""
        staged = self._staged.get(name)
        if staged is None:
            raise ModelNotFound(f"no staged copy of language model {name!r}")
        prompts = [p.prompt_tokens for p in golden.prompts]
        session = staged.placed.session
        answer = await asyncio.to_thread(answer_all, session, prompts, golden.max_tokens)
        return staged.placed.variant.key, answer

    async def discard_staged(self, name: str) -> None:
        """Close the staged copy of ``name`` (its check failed, or another replaces it)."""
        staged = self._staged.pop(name, None)
        if staged is not None:
            await asyncio.to_thread(staged.placed.session.close)

    async def unload(self, name: str) -> None:
        loaded = self._models.pop(name, None)
        self._failed.pop(name, None)
        if loaded is not None:
            await loaded.scheduler.close(self._engine.drain_timeout_s)

    def names(self) -> list[str]:
        return list(self._models)

    async def load_each(self, directories: Sequence[Path]) -> None:
        """Load (or hot-swap) language-model packages; one that fails is logged, not fatal."""
        for directory in directories:
            if self.serves(directory):
                continue
            try:
                info = await self.load(directory)
                log.info("language model %s %s on %s", info.name, info.version, info.device)
            except Exception as exc:
                log.error("language model in %s is unavailable: %s", directory, exc)

    async def reconcile(self, directories: Sequence[Path]) -> None:
        """Serve exactly these packages (SIGHUP): new and changed ones load, removed unload."""
        wanted: set[str] = set()
        for directory in directories:
            try:
                wanted.add(load_package(directory).name)
            except PackageError:
                continue
        for name in set(self.names()) - wanted:
            await self.unload(name)
        await self.load_each(directories)

    def _drain(self, old: _Loaded) -> None:
        task = spawn(old.scheduler.close(self._engine.drain_timeout_s), name="llm-drain")
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def close(self) -> None:
        for name in list(self._staged):
            await self.discard_staged(name)
        for name in list(self._models):
            await self.unload(name)
        if self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)


def _check_sampling(sampling: Sampling) -> None:
    if not 0 <= sampling.temperature <= 100:
        raise InvalidInput(f"temperature: {sampling.temperature} is not between 0 and 100")
    if not 0 < sampling.top_p <= 1:
        raise InvalidInput(f"top_p: {sampling.top_p} is not in (0, 1]")
    if sampling.top_k < 0:
        raise InvalidInput(f"top_k: {sampling.top_k} must not be negative")
    if len(sampling.stop) > MAX_STOP or not all(
        0 < len(s) <= MAX_STOP_CHARS for s in sampling.stop
    ):
        raise InvalidInput(
            f"stop: at most {MAX_STOP} strings of 1 to {MAX_STOP_CHARS} characters each"
        )


def _characters(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(message.content) for message in request.messages)
    return len(request.prompt or "")


def _prompt(session: GenerativeSession, request: GenerationRequest) -> list[int]:
    """The request's prompt tokens: its chat in the model's own template, or its text."""
    if request.messages is not None:
        facts = session.facts
        text = render_chat(
            facts.chat_template, request.messages, bos=facts.bos_token, eos=facts.eos_token
        )
    else:
        text = request.prompt or ""
    return session.tokenize(text, add_special=True)


def _digest(placed: Placed) -> str:
    file = placed.variant.files[0]
    return placed.variant.sha256.get(file.name) or file_sha256(file)


def _info(
    package: ModelPackage, placed: Placed, scheduler: Scheduler, digest: str
) -> LanguageModelInfo:
    facts = placed.session.facts
    return LanguageModelInfo(
        name=package.name,
        version=package.version,
        task=package.task,
        runtime=placed.runtime,
        device=placed.device,
        architecture=facts.architecture,
        parameters=facts.parameters,
        quantization=facts.quantization,
        size_bytes=facts.size_bytes,
        context=scheduler.sequence_context,
        digest=digest,
        modified=(package.root / "model.toml").stat().st_mtime or time.time(),
        chat_template=facts.chat_template,
    )
