"""Peers: other boards (or a Triton/KServe server) serving a model as lanes of its instance group.

A ``[[peer]]`` table names a server that speaks the Open Inference Protocol; for each model it
may take, the peer becomes one more lane of the model's ``InstanceGroup`` — ``concurrency``
remote sessions on the device ``peer:<name>`` — so the scheduler (``schedule``) hands it a batch
only when it is expected to finish sooner than the local queue: its EWMA service time includes
the network, and the local device's pacing wait counts against the local lanes. The governor
throttles the local device only (``engine.gate`` leaves peers unthrottled), so a hot board's
overflow moves to its peers instead of being refused.

A model whose model.toml says ``[serving] local_only = true``, and every sealed model (its
plaintext exists only in this device's memory), never gets a peer lane.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgeagent.hardware.instances import InstanceGroup, Lane
from edgeagent.hardware.plan_search import MeasuredPlan
from edgeagent.hardware.plan_shape import PlanShape
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import ModelPackage
from edgeagent.netaddr import is_loopback
from edgeagent.runtimes.base import InferenceError, Session, default_threads
from edgeagent.runtimes.remote import PeerLink, PeerState, RemoteSession, normal_fingerprint
from edgeagent.sections import computed_setting, require, setting

log = logging.getLogger(__name__)

SOURCE = "peer"  # a peer lane's plan source: measured by its warm-up request, not a search


@dataclass(frozen=True)
class PeerSettings:
    """One ``[[peer]]`` table: a server that may take some of this agent's models."""

    url: str = setting("", "the peer's v2 HTTP API: http(s)://host:port (required)")
    name: str = setting("", "its name in status and metrics; empty = host:port of the url")
    models: list[str] = computed_setting(
        list, "models it may take (the same name there); empty = every model not local_only"
    )
    token: str = setting("", "bearer token the peer's TCP listener asks for", secret=True)
    ca_file: Path | None = setting(None, "CA that signed the peer's certificate (https)")
    cert_file: Path | None = setting(None, "this agent's client certificate, for mTLS")
    key_file: Path | None = setting(None, "the client certificate's private key")
    fingerprint: str = setting(
        "", "SHA-256 of the peer's certificate (hex): used only if it matches; https only"
    )
    latency_budget_ms: float = setting(
        1000.0, "one batch there, network included; later = failed, served locally", "ms"
    )
    concurrency: int = setting(2, "batches in flight to it at once")
    reprobe_backoff_s: float = setting(
        1.0, "a failed peer is re-probed after this long, doubling each time", "s"
    )
    reprobe_backoff_max_s: float = setting(60.0, "the back-off doubles up to this", "s")

    def validate(self) -> None:
        parts = urlsplit(self.url)
        require(
            parts.scheme in ("http", "https") and bool(parts.hostname),
            "peer",
            "url",
            f"must be http(s)://host:port, not {self.url!r}",
        )
        plain_lan = parts.scheme == "http" and not is_loopback(parts.hostname or "")
        require(
            not (plain_lan and self.token),
            "peer",
            "token",
            "would cross the network in clear: use an https url for a non-loopback peer",
        )
        require(
            not self.fingerprint or parts.scheme == "https",
            "peer",
            "fingerprint",
            "pins a certificate: the url must be https",
        )
        digits = normal_fingerprint(self.fingerprint)
        require(
            not digits or (len(digits) == 64 and all(c in "0123456789abcdef" for c in digits)),
            "peer",
            "fingerprint",
            "must be a SHA-256 digest: 64 hex digits (colons allowed)",
        )
        require(
            (self.cert_file is None) == (self.key_file is None),
            "peer",
            "cert_file",
            "cert_file and key_file go together",
        )
        require(self.latency_budget_ms > 0, "peer", "latency_budget_ms", "must be positive")
        require(1 <= self.concurrency <= 64, "peer", "concurrency", "must be between 1 and 64")
        require(self.reprobe_backoff_s > 0, "peer", "reprobe_backoff_s", "must be positive")
        require(
            self.reprobe_backoff_max_s >= self.reprobe_backoff_s,
            "peer",
            "reprobe_backoff_max_s",
            "must be at least reprobe_backoff_s",
        )

    @property
    def label(self) -> str:
        parts = urlsplit(self.url)
        return self.name or f"{parts.hostname}:{parts.port or ''}".rstrip(":")

    def link(self) -> PeerLink:
        return PeerLink(
            name=self.label,
            url=self.url,
            token=self.token,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            fingerprint=self.fingerprint,
            timeout_s=self.latency_budget_ms / 1e3,
        )


def peers_problem(peers: Sequence[PeerSettings]) -> str:
    """Why a list of peers is unusable as a whole (two with one name); "" when fine."""
    labels = [peer.label for peer in peers]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    return f"two peers are named {', '.join(twice)}: give each a distinct name" if twice else ""


def stays_local(package: ModelPackage) -> str:
    """Why ``package`` must never leave the device ("" when it may): local_only, or sealed."""
    if any(variant.sealed_files for variant in package.variants):
        return "sealed"
    if package.serving.local_only:
        return "local_only"
    return ""


def takes(peer: PeerSettings, package: ModelPackage) -> bool:
    return not peer.models or package.name in peer.models


def with_peers(package: ModelPackage, session: Session, peers: Sequence[PeerSettings]) -> Session:
    """``session`` with a lane on every peer that may take ``package`` (itself when none may).

    Each lane's first request is a warm-up batch of the package's sample input: its time is
    the lane's prior service time (a peer that fails it starts out of the rotation, in
    back-off, and the model serves locally). Blocking: call it in a worker thread.
    """
    taking = [peer for peer in peers if takes(peer, package)]
    why = stays_local(package)
    if not taking or why:
        if taking:
            log.info("%s stays on this device (%s): no peer takes it", package.name, why)
        return session
    lanes = [peer_lane(peer, package, session) for peer in taking]
    if isinstance(session, InstanceGroup):
        return InstanceGroup(
            session.lanes[0].sessions, session.plan, [*session.lanes[1:], *lanes], lone=session.lone
        )
    threads = default_threads()
    plan = MeasuredPlan(PlanShape(1, threads, package.serving.max_batch_size), "fixed", threads)
    return InstanceGroup([session], plan, lanes)


def peer_lane(peer: PeerSettings, package: ModelPackage, local: Session) -> Lane:
    """``peer.concurrency`` remote sessions of ``package`` on ``peer``, primed by one warm-up."""
    state = PeerState(peer.link(), package.name, peer.reprobe_backoff_s, peer.reprobe_backoff_max_s)
    batching = package.serving.max_batch_size > 0
    sessions = [
        RemoteSession(state, local.inputs, local.outputs, batching=batching)
        for _ in range(peer.concurrency)
    ]
    figures = {}
    began = time.monotonic()
    try:
        sessions[0].run(sample_feeds(package))
        seconds = time.monotonic() - began
        figures[PlanShape(peer.concurrency, 1, 1).label] = peer.concurrency / max(seconds, 1e-6)
        log.info("%s may run on peer %s (%.1f ms a request)", package.name, state.link.name,
                 seconds * 1e3)  # fmt: skip
    except InferenceError as exc:
        log.warning("%s: peer %s is out of the rotation for now: %s", package.name,
                    state.link.name, exc)  # fmt: skip
    plan = MeasuredPlan(PlanShape(peer.concurrency, 1, 1), SOURCE, 0, figures)
    return Lane(state.link.device, plan, sessions)
