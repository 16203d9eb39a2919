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
    _DEPLOYMENT_RE,
    ManifestError,
    ReleaseManifest,
    _string,
    _validity_and_serial,
)
from edgeagent.fleet.signing import Refused, format_time, loads_strict
from edgeagent.fleet.trust import TrustStore
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
    if not isinstance(document, dict) or document.get("type") != KIND:
        raise ManifestError("cancellation: must be a JSON object of type 'cancel'")
    if type(document.get("format")) is not int or document["format"] != FORMAT:
        raise ManifestError(
            f"cancellation format: {str(document.get('format'))[:20]!r} is not {FORMAT}",
            "unsupported_format",
        )
    if set(document) != _FIELDS:
        missing = ", ".join(sorted(_FIELDS - set(document))) or "-"
        extra = ", ".join(sorted(set(document) - _FIELDS)) or "-"
        raise ManifestError(f"cancellation: missing field(s) {missing}; unknown field(s) {extra}")
    issued_at, expires, serial = _validity_and_serial(document, "cancellation")
    reason = document["reason"]
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ManifestError(f"cancellation reason: must be text of at most {MAX_REASON_CHARS}")
    return Cancellation(
        model=_string(document, "model", NAME_RE, "1-64 letters, digits, '_', '-' or '.'"),
        deployment_id=_string(
            document, "deployment_id", _DEPLOYMENT_RE, "1-128 letters, digits, '_', '.', ':', '-'"
        ),
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
