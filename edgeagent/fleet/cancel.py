"""Cancellations: the hub's signed word that an aborted deployment's releases must not install.

An abort stops the hub sending, but what it already sent may still be on its way: a device
that was offline holds its release in its persistent MQTT session and gets it when it comes
back. AWS IoT Jobs cancels the queued executions of a cancelled job; MQTT cannot take a queued
message back, so the hub sends a cancellation after it, on the same device topic, and the
device refuses a release that a cancellation it holds covers (code ``cancelled``).

A cancellation names a model, the release's ``deployment_id`` and the highest ``serial`` the
aborted deployment sent: it covers that model's releases of that deployment id with a serial up
to it, so a later deployment of the same release (signed with higher serials) is not covered.
It is signed by the same key(s) as the releases it covers (the trust file's ``release`` role):
a payload of ``"type": "cancel"`` can never parse as a release, nor a release as a cancellation.
It lives until ``expires`` — the covered releases' own expiry: after it they are refused as
``expired`` anyway — so a device keeps it only that long.

A cancellation comes too late for an install already past its last check (the moment before
the install step: after download and unpack): that install finishes and is reported as usual,
as AWS IoT Jobs leaves an in-progress execution alone unless forced. Undoing a commit is a
rollback, a new release.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from edgeagent.fleet import outcomes
from edgeagent.fleet.manifest import (
    ManifestError,
    ReleaseManifest,
    read_deployment_id,
    read_validity,
)
from edgeagent.fleet.signing import Refused, format_time, loads_strict
from edgeagent.fleet.trust import TrustStore
from edgeagent.fleet.wire import Reader, integer_in, is_object
from edgeagent.models.names import NAME_RE

KIND = "cancel"  # the payload's "type": what ``agent_manifest.claimed_kind`` routes on
FORMAT = 1
MAX_REASON_CHARS = 200
_FIELDS = {"type", "format", "model", "deployment_id", "serial", "issued_at", "expires", "reason"}

__all__ = ["FORMAT", "KIND", "Cancellation", "parse_cancellation", "verify_cancellation"]


@dataclass(frozen=True)
class Cancellation:
    """What one cancellation covers (module docstring) and until when."""

    model: str
    deployment_id: str
    serial: int  # the highest serial of the deployment's releases it covers
    issued_at: datetime
    expires: datetime
    reason: str = ""  # for people: why the deployment was aborted

    def covers(self, manifest: ReleaseManifest) -> bool:
        return (
            manifest.model == self.model
            and manifest.deployment_id == self.deployment_id
            and manifest.serial <= self.serial
        )

    def refusal(self, manifest: ReleaseManifest) -> Refused:
        """The refusal of a release this cancellation covers."""
        why = f": {self.reason}" if self.reason else ""
        return Refused(
            outcomes.CANCELLED,
            f"{manifest.model} {manifest.version} (serial {manifest.serial}): deployment "
            f"{self.deployment_id} was cancelled by the hub{why}; nothing installed",
        )

    def to_payload(self) -> bytes:
        """The canonical bytes the hub signs (sorted keys, no spaces)."""
        document = {
            "type": KIND,
            "format": FORMAT,
            "model": self.model,
            "deployment_id": self.deployment_id,
            "serial": self.serial,
            "issued_at": format_time(self.issued_at),
            "expires": format_time(self.expires),
            "reason": self.reason[:MAX_REASON_CHARS],
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


def parse_cancellation(payload: bytes) -> Cancellation:
    """Validate every field of a cancellation payload; call only on signature-checked bytes."""
    document = loads_strict(payload, "cancellation")
    reader = Reader("cancellation", ManifestError)
    if not is_object(document) or document.get("type") != KIND:
        raise reader.fail("", "must be a JSON object of type 'cancel'")
    if integer_in(document.get("format"), FORMAT, FORMAT) is None:
        raise ManifestError(
            f"cancellation format: {str(document.get('format'))[:20]!r} is not {FORMAT}",
            "unsupported_format",
        )
    reader.fields(document, _FIELDS)
    issued_at, expires, serial = read_validity(reader, document)
    problem = f"must be text of at most {MAX_REASON_CHARS}"
    reason = reader.bounded_text(document["reason"], "reason", MAX_REASON_CHARS, problem)
    return Cancellation(
        model=reader.text(
            document["model"], "model", NAME_RE, "1-64 letters, digits, '_', '-' or '.'"
        ),
        deployment_id=read_deployment_id(reader, document),
        serial=serial,
        issued_at=issued_at,
        expires=expires,
        reason=reason,
    )


def verify_cancellation(
    envelope: bytes, trust: TrustStore, *, now: datetime | None = None
) -> Cancellation:
    """Signatures under the ``release`` role, then every field, then its lifetime: an expired
    cancellation covers only releases that are expired too, so it is refused (``expired``)."""
    moment = trust.effective_now(now)
    cancellation = parse_cancellation(trust.verify(envelope, "release"))
    if cancellation.expires <= moment:
        raise Refused(
            outcomes.EXPIRED,
            f"cancellation of {cancellation.deployment_id}: expired at "
            f"{format_time(cancellation.expires)}",
        )
    return cancellation
