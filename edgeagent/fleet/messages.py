"""The device → hub messages: the one contract both sides compile against.

Four messages, one per device topic kind (``fleet.topics.DEVICE_KINDS``):

- ``StateReport`` on ``…/state`` (retained): who the device is, what it serves, how its
  updates went, its governor state — rebuilt whenever something changes;
- ``Event`` on ``…/events``: one per step of an install; the last (``step == "done"``) carries
  the install's ``Outcome``;
- ``Outcome``: how an install ended (in the done event and in the report's update history);
- availability on ``…/availability`` (retained): the plain text ``online`` / ``offline`` (the
  Last Will).

The device writes them with ``encode`` (``updates.report`` is the one writer); ``hub status``
and the hub server read them with ``decode_state`` / ``decode_event`` / ``decode_availability``.
Every JSON message carries ``schema``; one without it comes from a release before this
contract, whose messages had the same fields (tests/fixtures/fleet holds recordings of them). A
field is only ever added with a default, so ``schema`` changes only when a field's meaning does;
a hub refuses a schema newer than it reads rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

from edgeagent.fleet.signing import TrustError, loads_strict
from edgeagent.fleet.wire import MessageError, Scalar, doc, dump, json_schema, parse

SCHEMA = 1
RESULTS = ("succeeded", "failed", "refused")
Result = Literal["succeeded", "failed", "refused"]
AVAILABILITY = ("online", "offline")
DONE = "done"  # the step of an install's last event
Detail = Union[Scalar, list[Scalar], dict[str, Scalar]]  # noqa: UP007 (read at run time)
SECTIONS = ("models", "profile", "governor", "device_key")  # the parts read from the daemon

__all__ = ["AVAILABILITY", "DONE", "RESULTS", "SCHEMA", "MessageError"]


@dataclass(frozen=True)
class Outcome:
    """How one install (or trust rotation, or refusal) ended."""

    result: Result = field(
        metadata=doc("succeeded, failed (rolled back) or refused (nothing changed)")
    )
    code: str = field(
        default="", metadata=doc("why, for machines: committed, load_failed, malformed, ...")
    )
    message: str = field(default="", metadata=doc("why, for people"))
    model: str = field(
        default="", metadata=doc("the release's model ('' when its signature was not good)")
    )
    version: str = field(default="", metadata=doc("the release's version"))
    deployment_id: str = field(default="", metadata=doc("the deployment the release belongs to"))
    at: float | None = field(
        default=None, metadata=doc("when it ended, seconds since the epoch (device clock)")
    )
    canary: dict[str, Scalar] | None = field(
        default=None, metadata=doc("the canary's figures, when one ran")
    )


@dataclass(frozen=True)
class Progress:
    """The install in progress: its last step and release ("idle" when none)."""

    state: str = field(default="idle", metadata=doc("the last step reached, or idle"))
    model: str = field(default="", metadata=doc("the release's model"))
    version: str = field(default="", metadata=doc("the release's version"))
    deployment_id: str = field(default="", metadata=doc("the deployment the release belongs to"))
    detail: dict[str, Detail] = field(
        default_factory=dict, metadata=doc("step figures (bytes, variants, ...)", rest=True)
    )


@dataclass(frozen=True)
class Updates:
    """The device's updates: the one in progress, the last finished, the recent ones."""

    current: Progress = field(default_factory=Progress, metadata=doc("the install in progress"))
    last: Outcome | None = field(default=None, metadata=doc("the last finished install"))
    history: list[Outcome] = field(
        default_factory=list, metadata=doc("recent outcomes, oldest first (at most 10)")
    )


@dataclass(frozen=True)
class Backend:
    """Where one loaded version runs."""

    runtime: str = field(default="", metadata=doc("onnxruntime, litert, openvino"))
    device: str = field(
        default="", metadata=doc("the accelerator (execution provider, delegate, device)")
    )
    precision: str = field(default="", metadata=doc("fp32, fp16, int8"))


@dataclass(frozen=True)
class Traffic:
    """What the active version served: counters since it loaded (the hub takes throughput and
    error rate from two reports' difference) and the latency of its newest answers."""

    requests: int = field(default=0, metadata=doc("requests since the version loaded"))
    errors: int = field(
        default=0, metadata=doc("of them failed: bad input, overload, run errors, time-outs")
    )
    p50_ms: float | None = field(
        default=None, metadata=doc("median latency of the newest answered requests, ms")
    )
    p95_ms: float | None = field(
        default=None, metadata=doc("95th percentile latency of the same requests, ms")
    )


@dataclass(frozen=True)
class ModelState:
    """One model the device serves."""

    state: str = field(default="", metadata=doc("READY, LOADING, UNAVAILABLE, ..."))
    active_version: str | None = field(
        default=None, metadata=doc("the version that answers requests")
    )
    versions: dict[str, Backend] = field(
        default_factory=dict, metadata=doc("every loaded version and its backend")
    )
    traffic: Traffic | None = field(
        default=None, metadata=doc("the active version's requests, errors and latency")
    )


@dataclass(frozen=True)
class Board:
    """The hardware, as detected."""

    model: str = field(default="", metadata=doc("the board's model string (device tree), if any"))
    arch: str = field(default="", metadata=doc("the CPU architecture"))


@dataclass(frozen=True)
class Profile:
    """The device profile the agent chose."""

    profile: str = field(default="", metadata=doc("the profile's name"))
    board: Board = field(default_factory=Board, metadata=doc("the detected board"))


@dataclass(frozen=True)
class Temperature:
    """One temperature sensor."""

    sensor: str = field(metadata=doc("the sensor's key"))
    celsius: float | None = field(
        default=None, metadata=doc("the reading (null when the sensor is offline)")
    )


@dataclass(frozen=True)
class Power:
    """The power the device draws."""

    total_w: float | None = field(default=None, metadata=doc("watts, when a sensor reads them"))


@dataclass(frozen=True)
class Governor:
    """The power and thermal governor."""

    state: str = field(default="", metadata=doc("normal, warm, hot, critical, ..."))
    actions: list[str] = field(
        default_factory=list, metadata=doc("what it does about it: shedding, throttling, ...")
    )
    temperatures: list[Temperature] = field(
        default_factory=list, metadata=doc("every sensor's reading")
    )
    power: Power = field(default_factory=Power, metadata=doc("power draw"))


@dataclass(frozen=True)
class DeviceKey:
    """The device's public key, for sealed releases (``hub status --recipients``)."""

    scheme: str = field(default="", metadata=doc("the sealing scheme"))
    public_key: str = field(default="", metadata=doc("base64 X25519 public key"))


@dataclass(frozen=True)
class StateReport:
    """A device's retained state report."""

    schema: int = field(default=SCHEMA, metadata=doc("the contract's version (absent: 1)"))
    device_id: str = field(
        default="", metadata=doc("the device's id (the topic's is authoritative)")
    )
    group: str = field(default="", metadata=doc("the device group it belongs to"))
    agent_version: str = field(default="", metadata=doc("the agent's version"))
    platform: str = field(
        default="", metadata=doc("the agent's platform: linux_x86_64, linux_aarch64, ...")
    )
    python: str = field(default="", metadata=doc("the agent's Python version, e.g. 3.11"))
    online: bool = field(default=True, metadata=doc("always true here; availability says offline"))
    updated_at: float | None = field(
        default=None, metadata=doc("when the report was built (device clock)")
    )
    updates: Updates = field(default_factory=Updates, metadata=doc("the device's updates"))
    models: dict[str, ModelState] = field(
        default_factory=dict, metadata=doc("every model it serves, by name")
    )
    profile: Profile | None = field(default=None, metadata=doc("device profile and board"))
    governor: Governor | None = field(default=None, metadata=doc("governor state"))
    device_key: DeviceKey | None = field(default=None, metadata=doc("the device's public key"))
    errors: dict[str, str] = field(
        default_factory=dict, metadata=doc("sections the device could not read, and why")
    )


@dataclass(frozen=True)
class Event:
    """One step of an install; the last one (step "done") says how it ended."""

    step: str = field(metadata=doc("verified, downloading, ..., done"))
    schema: int = field(default=SCHEMA, metadata=doc("the contract's version (absent: 1)"))
    device_id: str = field(
        default="", metadata=doc("the device's id (the topic's is authoritative)")
    )
    model: str = field(default="", metadata=doc("the release's model"))
    version: str = field(default="", metadata=doc("the release's version"))
    deployment_id: str = field(default="", metadata=doc("the deployment the release belongs to"))
    at: float | None = field(
        default=None, metadata=doc("when, seconds since the epoch (device clock)")
    )
    bytes: int | None = field(
        default=None, metadata=doc("bytes downloaded so far (downloading, downloaded)")
    )
    total: int | None = field(default=None, metadata=doc("bytes to download (downloading)"))
    result: Result | None = field(
        default=None, metadata=doc("on the done event: how the install ended")
    )
    code: str = field(default="", metadata=doc("on the done event: why, for machines"))
    message: str = field(default="", metadata=doc("on the done event: why, for people"))
    canary: dict[str, Scalar] | None = field(
        default=None, metadata=doc("on the done event: canary figures")
    )
    detail: dict[str, Detail] = field(
        default_factory=dict, metadata=doc("other step figures", rest=True)
    )

    @property
    def outcome(self) -> Outcome | None:
        """The install's outcome when this is its last event."""
        if self.step != DONE or self.result is None:
            return None
        return Outcome(
            self.result,
            self.code,
            self.message,
            self.model,
            self.version,
            self.deployment_id,
            self.at,
            self.canary,
        )

    @classmethod
    def done(cls, device_id: str, outcome: Outcome) -> Event:
        """The last event of an install: its outcome, from the device ``device_id``."""
        return cls(
            DONE,
            device_id=device_id,
            model=outcome.model,
            version=outcome.version,
            deployment_id=outcome.deployment_id,
            at=outcome.at,
            result=outcome.result,
            code=outcome.code,
            message=outcome.message,
            canary=outcome.canary,
        )


Message = Union[StateReport, Event]  # noqa: UP007


def encode(message: Message) -> dict[str, Any]:
    """The JSON-ready form of a message (what the MQTT link serialises)."""
    document: dict[str, Any] = dump(message)
    return document


def _document(payload: bytes | dict[str, Any], what: str) -> dict[str, Any]:
    if isinstance(payload, dict):
        document: Any = payload
    else:
        try:
            document = loads_strict(bytes(payload), what)
        except TrustError as exc:
            raise MessageError(what, "", exc.message.removeprefix(f"{what}: ")) from exc
    if not isinstance(document, dict):
        raise MessageError(what, "", f"must be a JSON object, got {type(document).__name__}")
    schema = document.get("schema", 1)
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA:
        raise MessageError(
            what, "schema", f"{schema} is newer than this side reads ({SCHEMA}); upgrade it"
        )
    return document


def decode_state(payload: bytes | dict[str, Any], what: str = "state report") -> StateReport:
    """A state report from its payload (or decoded JSON); MessageError naming the field.

    A section the device could not read was sent as ``{"error": "..."}`` in its place before
    this contract; it is read into ``errors`` so such a report still parses.
    """
    document = dict(_document(payload, what))
    legacy = {
        section: value["error"]
        for section in SECTIONS
        if isinstance(value := document.get(section), dict)
        and set(value) == {"error"}
        and isinstance(value["error"], str)
    }
    errors = document.get("errors", {})
    if legacy and isinstance(errors, dict):
        document = {k: v for k, v in document.items() if k not in legacy}
        document["errors"] = {**errors, **legacy}
    return parse(StateReport, document, what)


def decode_event(payload: bytes | dict[str, Any], what: str = "event") -> Event:
    """An install event; its last (``done``) must say how the install ended."""
    event = parse(Event, _document(payload, what), what)
    if event.step == DONE and event.result is None:
        raise MessageError(what, "result", "missing (the done event says how the install ended)")
    return event


def decode_availability(payload: bytes, what: str = "availability") -> str:
    """``online`` or ``offline``."""
    text = bytes(payload).decode("utf-8", errors="replace").strip()
    if text not in AVAILABILITY:
        raise MessageError(what, "", f"must be one of {AVAILABILITY}, got {text[:32]!r}")
    return text


def schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each JSON message, by file name (the docs publish them)."""
    base = "https://edgeagent.invalid/schemas/fleet"
    return {
        "state-report.json": json_schema(
            StateReport, title="edgeagent state report", identifier=f"{base}/state-report.json"
        ),
        "event.json": json_schema(Event, title="edgeagent event", identifier=f"{base}/event.json"),
        "outcome.json": json_schema(
            Outcome, title="edgeagent update outcome", identifier=f"{base}/outcome.json"
        ),
        "availability.json": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"{base}/availability.json",
            "title": "edgeagent availability",
            "description": "Plain text, not JSON: the retained availability (the Last Will "
            "sets offline).",
            "enum": list(AVAILABILITY),
        },
    }
