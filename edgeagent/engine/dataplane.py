"""The data plane: what every transport (HTTP, gRPC, shared memory) asks of the engine.

Transports only translate wire formats into these calls and the answers back (an inference is
one ``infer(request, name, version)`` with the types of ``engine/requests.py``); every decision
(which model and version, which outputs, the request's priority and deadline, the answer's
datatype, the repository and statistics views, image classification) is made here once, so two
transports can never disagree. The idea is MLServer's ``DataPlane``; errors are
``ServingError``s that each transport maps to its own status codes.

A little over 500 lines, on purpose: the image entries (an upload's classify and detect, a
camera's frame, Frigate's pixels) share the decode slots, the detector lookup and the head
decoding with each other and with ``infer``'s hooks and sequences; split, each transport would
again have a place of its own where such a decision is made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from edgeagent import __version__
from edgeagent.engine.budget import Budget
from edgeagent.engine.errors import InvalidInput, ModelNotFound, NotReady
from edgeagent.engine.hooks import Frame, Hooks, InferenceEvent
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.registry import READY, ModelRegistry
from edgeagent.engine.requests import InferenceRequest, InferenceResponse, datatype_of
from edgeagent.engine.sequences import sequence_control
from edgeagent.engine.serving import LoadedModel
from edgeagent.engine.settings import EngineSettings
from edgeagent.heap import release_free_memory
from edgeagent.models.detector import decode_row, detections_json
from edgeagent.models.package import ModelPackage, Preprocess, TensorSpec
from edgeagent.models.preprocess import (
    image_tensor,
    open_image,
    prepare_opened,
    prepare_pixels,
    top_k,
)
from edgeagent.models.tasks.decode import Detections, Geometry
from edgeagent.runtimes.facts import v2_platform

if TYPE_CHECKING:
    from PIL import Image

T = TypeVar("T")

EXTENSIONS = [
    "binary_tensor_data",
    "model_repository",
    "statistics",
    "model_configuration",
    "system_shared_memory",
]


@dataclass(frozen=True)
class InferOptions:
    """Per-request engine options from the v2 ``parameters`` (same on every transport)."""

    priority: int | None = None  # 1 = most urgent; None = [server] default_priority
    timeout_s: float | None = None  # None = [server] request_timeout_s


def infer_options(request: InferenceRequest, settings: EngineSettings) -> InferOptions:
    """Triton's request parameters ``priority`` (1 = most urgent, 0 = default) and ``timeout`` (µs).

    A client's timeout, like a transport's deadline, can shorten the configured one, never
    lengthen it.
    """
    parameters = request.parameters
    priority = parameters.get("priority")
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or priority < 0
    ):
        raise InvalidInput(f"parameters.priority must be a non-negative integer, got {priority!r}")
    timeout = parameters.get("timeout")
    if timeout is not None and (
        not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0
    ):
        raise InvalidInput(f"parameters.timeout must be a positive integer (µs), got {timeout!r}")
    limits = [] if timeout is None else [timeout / 1e6]
    if request.deadline_s is not None:
        limits.append(max(request.deadline_s, 1e-3))  # an expired deadline still gets its 504
    timeout_s = min(settings.request_timeout_s, *limits) if limits else None
    return InferOptions(priority=priority or None, timeout_s=timeout_s)


def select_outputs(request: InferenceRequest, package: ModelPackage) -> list[TensorSpec]:
    """The outputs to answer with, in the order asked; unknown or repeated names are refused.

    Called before the model runs so that a typo costs the client a 400, not an inference.
    """
    specs = {spec.name: spec for spec in package.outputs}
    if request.outputs is None:
        return list(package.outputs)
    chosen: list[TensorSpec] = []
    for name in request.outputs:
        if name not in specs:
            raise InvalidInput(f"unknown output {name!r} (the model has: {', '.join(specs)})")
        if specs[name] in chosen:
            raise InvalidInput(f"output {name!r} is requested twice")
        chosen.append(specs[name])
    return chosen


def parse_top_k(value: str | None, default: int, classes: int) -> int:
    """The ``top_k`` query parameter: 1..classes, the package's default when absent."""
    if value is None:
        return min(default, classes)
    try:
        k = int(value)
    except ValueError:
        raise InvalidInput(f"query parameter top_k must be an integer, got {value!r}") from None
    if not 1 <= k <= classes:
        raise InvalidInput(f"query parameter top_k must be between 1 and {classes}, got {k}")
    return k


def tensor_metadata(spec: TensorSpec, datatype: str) -> dict[str, Any]:
    return {"name": spec.name, "datatype": datatype, "shape": list(spec.shape)}


# Images at least this large hand their freed pages back to the system after decoding.
TRIM_PIXELS = 4_000_000


def _decode(
    prepare: Callable[[Image.Image, Preprocess], T], image: Image.Image, spec: Preprocess
) -> T:
    """``prepare(image, spec)``, then the decoded pixels freed, in the calling (worker) thread.

    glibc keeps what a thread frees in that thread's arena: after a 40 Mpx image, ~150 MB stay
    resident in each arena a decode ran in (the daemon has two), so the pixel budget alone
    would bound what is decoded at once but not the peak it leaves. A large image's pages are
    handed back at once (``malloc_trim``, a few ms beside a decode of a few hundred).
    """
    pixels = image.width * image.height
    try:
        return prepare(image, spec)
    finally:
        image.close()
        if pixels >= TRIM_PIXELS:
            release_free_memory()


def _detector(model: LoadedModel, min_score: float | None) -> ModelPackage:
    """The model's package if it is a detector the image routes can feed, else InvalidInput."""
    package = model.package
    if package.detection is None or package.preprocess is None:
        raise InvalidInput(
            f"model {package.name!r} ({package.task}) is not a detector with [detection] "
            f"and [preprocess] sections; use /v2/models/{package.name}/infer for its tensors"
        )
    if min_score is not None and not 0 <= min_score <= 1:
        raise InvalidInput(f"min_score must be between 0 and 1, got {min_score:g}")
    return package


def _not_a_classifier(package: ModelPackage) -> str:
    """Why /classify refuses a model of another task, and the route that serves it.

    Top-k over a detector's or a segmenter's first output would answer 200 with output
    indices as labels: a wrong answer that looks right, so it is a 400 that points elsewhere.
    """
    where = f"/v2/models/{package.name}/infer for its tensors"
    if package.task == "detection":
        where = f"/v1/models/{package.name}/detect for boxes, or {where}"
    return f"model {package.name!r} is a {package.task} model, not a classifier: use {where}"


def _event(model: LoadedModel, image: Frame, answer: dict[str, Any]) -> InferenceEvent:
    backend = model.backend
    return InferenceEvent(
        model=model.package.name,
        version=model.version,
        task=model.package.task,
        variant=f"{backend['runtime']}/{backend['precision']}@{backend['device']}",
        image=image,
        answer=answer,
        capture=model.package.capture,
    )


class DataPlane:
    """The engine as transports see it: one instance over the daemon's registry."""

    def __init__(
        self,
        registry: ModelRegistry,
        settings: EngineSettings,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        # Who else sees an answered image request (capture): called after the answer is made.
        self.hooks = Hooks()
        # A 40 Mpx image takes ~120 MB decoded and as much again resized: each image reserves
        # its pixels before decoding, so a burst of large uploads (small files: a flat PNG of
        # 40 Mpx is 115 kB) cannot exhaust a small board's memory; and no more decode at once
        # than there are inference threads, so decoding cannot starve inference of CPU.
        self._pixels = Budget(settings.max_decoding_pixels, "max_decoding_pixels", "pixels")
        self._decode_slots = asyncio.Semaphore(settings.worker_threads)

    # -- health and metadata ------------------------------------------------------------------

    def ready(self) -> bool:
        """True when at least one model takes traffic (SPEC §12)."""
        return any(entry["state"] == READY for entry in self.registry.index())

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "edgeagent", "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str | None = None) -> LoadedModel:
        """The loaded model (version) that serves ``name``; ModelNotFound or NotReady."""
        return self.registry.get(name, version)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """True when it takes traffic, False when it exists but does not; ModelNotFound else."""
        try:
            self.model(name, version)
        except NotReady:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """v2 model metadata (the same document over every transport)."""
        model = self.model(name, version)
        package = model.package
        return {
            "name": package.name,
            "versions": self.registry.versions(package.name),
            "platform": v2_platform(model.backend["runtime"]),
            "inputs": [tensor_metadata(s, datatype_of(s.dtype)) for s in package.inputs],
            "outputs": [tensor_metadata(s, datatype_of(s.dtype)) for s in package.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """Triton-style configuration (what ``tritonclient.get_model_config`` reads)."""
        model = self.model(name, version)
        package = model.package
        batched = model.max_batch_size > 0

        def dims(spec: TensorSpec) -> dict[str, Any]:
            shape = list(spec.shape[1:] if batched else spec.shape)
            return {
                "name": spec.name,
                "data_type": "TYPE_" + datatype_of(spec.dtype),
                "dims": shape,
            }

        runtime = model.backend["runtime"]
        return {
            "name": package.name,
            "platform": v2_platform(runtime),
            "backend": runtime,
            "max_batch_size": model.max_batch_size,
            "input": [dims(spec) for spec in package.inputs],
            "output": [dims(spec) for spec in package.outputs],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(package.serving.max_queue_delay_ms * 1000)
            },
            "version_policy": {"specific": {"versions": [model.version]}},
            # Which image route answers it (a client cannot tell a detector by its tensors).
            "parameters": {"task": {"string_value": package.task}},
        }

    # -- inference ------------------------------------------------------------------------------

    async def infer(
        self, request: InferenceRequest, name: str, version: str | None = None
    ) -> InferenceResponse:
        """Answer ``request`` with model ``name`` (its ``version``, else the serving one).

        The one call every transport makes per request: the model is looked up, the outputs
        chosen and the options read here, once. Outputs come back in the datatype the
        metadata advertises, whatever precision the variant computed in.
        """
        model = self.model(name, version)
        control = sequence_control(request.parameters)
        chosen = select_outputs(request, model.package)
        options = infer_options(request, self.settings)
        kwargs: dict[str, Any] = {}
        if options.priority is not None:
            kwargs["priority"] = options.priority
        if options.timeout_s is not None:
            kwargs["timeout_s"] = options.timeout_s

        async def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return await model.infer(feeds, **kwargs)

        if model.sequences is not None:  # a stateful model: each stream its own state
            if control is not None and request.outputs is None:
                hidden = model.sequences.hidden_outputs()  # kept here, fed back
                chosen = [spec for spec in chosen if spec.name not in hidden]
            results = await model.sequences.infer(control, request.inputs, run)
        elif control is not None:
            raise InvalidInput(
                f"model {model.package.name!r} keeps no state between requests: leave out "
                "parameters.sequence_id"
            )
        else:
            results = await run(request.inputs)
        return InferenceResponse(
            model_name=model.package.name,
            model_version=model.version,
            outputs={
                spec.name: np.asarray(results[spec.name]).astype(spec.dtype, copy=False)
                for spec in chosen
            },
            id=request.id,
        )

    async def classify(
        self,
        name: str,
        version: str | None,
        image: bytes,
        k: str | None,
        *,
        internal: bool = False,
    ) -> dict[str, Any]:
        """One image through the model: decode, preprocess (``_decoded``), infer, top-k.

        The hooks see the answer unless the request is the agent's own (``internal``)."""
        model = self.model(name, version)
        package = model.package
        if package.task != "classification":
            raise InvalidInput(_not_a_classifier(package))
        if package.preprocess is None:
            raise InvalidInput(
                f"model {package.name!r} has no [preprocess] section, so it cannot take images; "
                f"send tensors to /v2/models/{package.name}/infer instead"
            )
        output = package.outputs[0]
        k_value = parse_top_k(k, package.postprocess.top_k, output.shape[-1])
        started = time.perf_counter()
        tensor = await self._decoded(image, image_tensor, package.preprocess)
        answer = await model.infer({package.inputs[0].name: tensor})
        predictions = top_k(
            answer[output.name][0], package.labels, k_value, package.postprocess.softmax
        )
        latency_ms = (time.perf_counter() - started) * 1000.0
        backend = model.backend
        answer_json = {
            "model_name": package.name,
            "model_version": model.version,
            "labels": [p.label for p in predictions],
            "scores": [p.score for p in predictions],
            "indices": [p.index for p in predictions],
            "backend": backend["runtime"],
            "device": backend["device"],
            "precision": backend["precision"],
            "latency_ms": round(latency_ms, 3),
        }
        if self.hooks and not internal:
            self.hooks.notify(_event(model, image, answer_json))
        return answer_json

    async def detect(
        self,
        name: str,
        version: str | None,
        image: bytes,
        min_score: float | None = None,
        *,
        internal: bool = False,
    ) -> dict[str, Any]:
        """One image through a detector: decode, preprocess, infer, decode the head, and boxes
        mapped back to the image's own pixels, best score first.

        ``min_score`` is this request's score threshold in place of the package's (down to
        ``DECODE_FLOOR``).
        """
        model = self.model(name, version)
        package = _detector(model, min_score)
        assert package.preprocess is not None
        started = time.perf_counter()
        tensor, geometry = await self._decoded(image, prepare_opened, package.preprocess)
        found = await self._boxes(model, tensor, geometry, min_score, {})
        backend = model.backend
        answer_json = {
            "model_name": package.name,
            "model_version": model.version,
            "detections": detections_json(package, found),
            "image_size": list(geometry.size),
            "backend": backend["runtime"],
            "device": backend["device"],
            "precision": backend["precision"],
            "latency_ms": round((time.perf_counter() - started) * 1000.0, 3),
        }
        if self.hooks and not internal:
            self.hooks.notify(_event(model, image, answer_json))
        return answer_json

    async def detect_pixels(
        self, name: str, pixels: np.ndarray, min_score: float | None = None
    ) -> tuple[ModelPackage, Detections]:
        """One decoded RGB frame (height × width × 3, uint8: what Frigate's zmq detector sends)
        through a detector: its own preprocessing, infer, the head decoded, and boxes in the
        frame's pixels, best first. The caller bounds the frame's size."""
        model = self.model(name, None)
        package = _detector(model, min_score)
        assert package.preprocess is not None
        tensor, geometry = await asyncio.to_thread(prepare_pixels, pixels, package.preprocess)
        found = await self._boxes(model, tensor, geometry, min_score, {})
        self._seen_frame(model, pixels, geometry, found)
        return package, found

    async def detect_frame(
        self,
        name: str,
        image: Image.Image,
        *,
        min_score: float | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
    ) -> tuple[ModelPackage, Detections]:
        """A decoded frame (a camera's) through a detector, at the caller's priority and
        deadline: the same model lookup, batcher, governor limits and head decoding as
        ``detect``, without the image upload's byte decoding."""
        model = self.model(name, None)
        package = _detector(model, min_score)
        assert package.preprocess is not None
        async with self._decode_slots:
            tensor, geometry = await asyncio.to_thread(prepare_opened, image, package.preprocess)
        options: dict[str, Any] = {}
        if priority is not None:
            options["priority"] = priority
        if timeout_s is not None:
            options["timeout_s"] = min(timeout_s, self.settings.request_timeout_s)
        found = await self._boxes(model, tensor, geometry, min_score, options)
        self._seen_frame(model, image, geometry, found)
        return package, found

    def _seen_frame(
        self, model: LoadedModel, frame: Frame, geometry: Geometry, found: Detections
    ) -> None:
        """The hooks see a detector's answer on a frame (capture encodes it if it keeps it)."""
        if self.hooks:
            answer = {
                "model_name": model.package.name,
                "model_version": model.version,
                "detections": detections_json(model.package, found),
                "image_size": list(geometry.size),
            }
            self.hooks.notify(_event(model, frame, answer))

    async def classify_frame(
        self, name: str, image: Image.Image, *, priority: int | None = None
    ) -> tuple[str, float]:
        """The best class of a decoded image (a camera's crop) and its score."""
        model = self.model(name)
        package = model.package
        if package.task != "classification" or package.preprocess is None:
            raise InvalidInput(_not_a_classifier(package))
        async with self._decode_slots:
            tensor = await asyncio.to_thread(image_tensor, image, package.preprocess)
        options = {} if priority is None else {"priority": priority}
        answer = await model.infer({package.inputs[0].name: tensor}, **options)
        best = top_k(
            answer[package.outputs[0].name][0], package.labels, 1, package.postprocess.softmax
        )[0]
        if self.hooks:
            labelled = {"labels": [best.label], "scores": [best.score], "indices": [best.index]}
            self.hooks.notify(_event(model, image, labelled))
        return best.label, best.score

    async def _boxes(
        self,
        model: LoadedModel,
        tensor: np.ndarray,
        geometry: Geometry,
        min_score: float | None,
        options: dict[str, Any],
    ) -> Detections:
        """Infer one prepared image and decode the head into boxes in ``geometry``'s pixels."""
        package = model.package
        answer = await model.infer({package.inputs[0].name: tensor}, **options)
        outputs = [np.asarray(answer[spec.name])[0] for spec in package.outputs]
        found = decode_row(package, outputs, geometry, min_score)
        if self.metrics is not None:
            self.metrics.detections.labels(package.name).inc(len(found))
        return found

    async def _decoded(
        self, data: bytes, prepare: Callable[[Image.Image, Preprocess], T], spec: Preprocess
    ) -> T:
        """``prepare`` of the image in ``data``, decoded within the pixel budget.

        The header is read first (no pixel decoded); the image's width × height is reserved
        from ``[server] max_decoding_pixels`` for as long as its pixels exist, waiting in
        arrival order up to the request time-out, then 503 (``Busy``). Decoding and resizing
        run in a worker thread: a large JPEG takes milliseconds of CPU that would otherwise
        stall every other request on the loop.
        """
        try:
            opened = await asyncio.to_thread(open_image, data, self.settings.max_image_pixels)
            async with (
                self._pixels.hold(opened.width * opened.height, self.settings.request_timeout_s),
                self._decode_slots,
            ):
                work = asyncio.ensure_future(asyncio.to_thread(_decode, prepare, opened, spec))
                try:
                    return await asyncio.shield(work)
                finally:
                    # A cancelled request's thread still holds the pixels: keep the reservation
                    # until it ends.
                    if not work.done():
                        await asyncio.wait({work})
                        work.exception()  # retrieved: nobody waits for it any more
        except ValueError as exc:
            raise InvalidInput(f"request body: {exc}") from None

    # -- repository and statistics ------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [e for e in self.registry.index() if not ready_only or e["state"] == READY]

    async def load(self, name: str) -> None:
        await self.registry.load(name)

    async def unload(self, name: str) -> None:
        await self.registry.unload(name)

    def statistics(self, name: str | None = None, version: str | None = None) -> list[dict]:
        """v2 statistics of every loaded version (of ``name``; of one ``version``)."""
        if name is not None and version is not None:
            model = self.model(name, version)
            return [model.stats.to_v2(name, model.version)]
        names = [name] if name is not None else sorted({e["name"] for e in self.registry.index()})
        stats = []
        for each in names:
            for v in self.registry.versions(each):
                try:
                    model = self.registry.get(each, v)
                except (NotReady, ModelNotFound):
                    continue  # unloaded versions have nothing to report
                stats.append(model.stats.to_v2(each, model.version))
        return stats
