"""A peer as one more device: a session whose ``run`` is an Open Inference Protocol v2 request.

Another edgeagent, a Triton server or a KServe predictor serves the model over v2 HTTP with
the binary tensor extension; a ``RemoteSession`` sends it a batch and checks what comes back
against the local model's outputs (names, datatype, shape, one row per input row) before
anyone sees it. The hardware layer puts such sessions in an instance group beside the local
ones (``hardware.peers``), where the scheduler gives a batch to whichever instance is expected
to finish it first — a peer's service time includes the network — and a batch whose peer failed
runs again on a local instance: the client gets exactly one answer.

A peer that fails (refused connection, an answer later than its latency budget, an HTTP error,
an answer of the wrong shape) leaves the rotation at once (``PeerState``) and is re-probed
(``GET /v2/health/ready``) in a background thread after a back-off that doubles up to a cap,
so no request pays for finding out whether it is back.

The client is the standard library's ``http.client``: one keep-alive connection per session,
TLS 1.2+ with a CA file, a client certificate for mTLS, and optionally the peer's certificate
pinned by its SHA-256 fingerprint (a site without a CA pins each peer instead).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from edgeagent.runtimes.base import InferenceError, Session, TensorInfo
from edgeagent.runtimes.oip import HEADER_LENGTH
from edgeagent.runtimes.oip_codec import WireError, decode_response, encode_request

RUNTIME = "remote"
DEVICE_PREFIX = "peer:"  # a peer's device key: "peer:<name>"
MAX_ANSWER_BYTES = 256 * 2**20  # an answer larger than this is refused unread
# How a kept-alive connection that the server closed fails on its next request.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def is_remote(device: str) -> bool:
    """Whether a device key names a peer (whose load the local governor does not steer)."""
    return device.startswith(DEVICE_PREFIX)


@dataclass(frozen=True)
class PeerLink:
    """How to reach one peer: its v2 base URL and credentials."""

    name: str
    url: str  # http(s)://host:port[/prefix] of the peer's v2 HTTP API
    token: str = ""  # sent as "Authorization: Bearer <token>"
    ca_file: Path | None = None  # CA that signed the peer's certificate (else the system's)
    cert_file: Path | None = None  # this agent's client certificate (mTLS)
    key_file: Path | None = None
    fingerprint: str = ""  # SHA-256 of the peer's certificate (hex): pins its identity
    timeout_s: float = 1.0  # the latency budget: one batch, network included

    @property
    def device(self) -> str:
        return f"{DEVICE_PREFIX}{self.name}"

    def connect(self) -> http.client.HTTPConnection:
        """A new connection (opened and, with a pin, its certificate checked)."""
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(
                host, port, timeout=self.timeout_s, context=self._tls()
            )
        else:
            connection = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        connection.connect()
        if self.fingerprint:
            sock = connection.sock
            der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
            seen = hashlib.sha256(der).hexdigest() if der else "none"
            if seen != normal_fingerprint(self.fingerprint):
                connection.close()
                raise InferenceError(
                    f"peer {self.name}: certificate fingerprint {seen} is not the pinned one"
                )
        return connection

    def _tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.fingerprint and self.ca_file is None:  # the pin is the identity check
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file or self.cert_file))
        return context

    def path(self, tail: str) -> str:
        return urlsplit(self.url).path.rstrip("/") + tail

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def normal_fingerprint(text: str) -> str:
    """A fingerprint as hex digits only, lower case ("AB:CD…" and "abcd…" are one pin)."""
    return text.replace(":", "").strip().lower()


class PeerState:
    """One peer's place in the rotation (for one model), shared by its sessions.

    Up until a run fails; then out of the rotation until its back-off has passed and a
    readiness probe, run in a background thread so no request waits for it, says it is back.
    The back-off doubles with each failure in a row up to ``backoff_max_s``; a good run resets it.
    """

    def __init__(
        self,
        link: PeerLink,
        model: str,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = link
        self.model = model
        self._base = backoff_s
        self._max = backoff_max_s
        self._backoff = backoff_s
        self._clock = clock
        self._changed = threading.Condition()
        self.up = True
        self.down_since: float | None = None  # when it last left the rotation
        self.retry_at: float | None = None
        self.last_error = ""
        self.failures = 0
        self.probes = 0
        self._probing = False

    def failed(self, reason: str) -> None:
        with self._changed:
            if self.up:
                self.down_since = self._clock()
            self.up = False
            self.failures += 1
            self.last_error = reason
            self.retry_at = self._clock() + self._backoff
            self._backoff = min(self._max, self._backoff * 2)
            self._changed.notify_all()

    def succeeded(self) -> None:
        with self._changed:
            self._backoff = self._base

    def in_rotation(self) -> bool:
        """Whether batches may go to the peer now; starts its re-probe when one is due."""
        with self._changed:
            if self.up:
                return True
            due = self.retry_at is not None and self._clock() >= self.retry_at
            if not due or self._probing:
                return False
            self._probing = True
        threading.Thread(
            target=self._probe, name=f"peer-probe:{self.link.name}", daemon=True
        ).start()
        return False

    def _probe(self) -> None:
        ready = False
        reason = ""
        try:
            connection = self.link.connect()
            try:
                model = quote(self.model, safe="")
                connection.request(
                    "GET", self.link.path(f"/v2/models/{model}/ready"), headers=self.link.headers()
                )
                answer = connection.getresponse()
                answer.read()
                if answer.status == 404:  # a server without per-model readiness (naive ones)
                    connection.request(
                        "GET", self.link.path("/v2/health/ready"), headers=self.link.headers()
                    )
                    answer = connection.getresponse()
                    answer.read()
                ready = answer.status == 200
                reason = f"readiness probe answered HTTP {answer.status}"
            finally:
                connection.close()
        except (OSError, http.client.HTTPException, InferenceError) as exc:
            reason = f"readiness probe: {exc}"
        with self._changed:
            self.probes += 1
            self._probing = False
            if ready:
                self.up = True
                self.retry_at = None
            else:
                self.last_error = reason
                self.retry_at = self._clock() + self._backoff
                self._backoff = min(self._max, self._backoff * 2)
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[PeerState], bool], timeout_s: float) -> bool:
        """Block until ``predicate(self)`` holds (after a failure or a probe); for tests and
        benchmarks that synchronise on the peer's state."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout_s)

    def status(self) -> dict[str, Any]:
        with self._changed:
            shown: dict[str, Any] = {
                "peer": self.link.name,
                "url": self.link.url,
                "in_rotation": self.up,
                "failures": self.failures,
                "probes": self.probes,
            }
            if self.last_error:
                shown["last_error"] = self.last_error
            if not self.up and self.retry_at is not None:
                shown["reprobe_in_s"] = round(max(0.0, self.retry_at - self._clock()), 3)
            return shown


@dataclass(frozen=True)
class PeerBackend:
    """Where a remote session runs, in the words of a profile's candidate."""

    runtime: str
    device: str
    precision: str


class RemoteSession(Session):
    """One model on one peer; one batch at a time over its own keep-alive connection."""

    runtime = RUNTIME
    precision = "remote"

    def __init__(
        self,
        state: PeerState,
        inputs: Sequence[TensorInfo],
        outputs: Sequence[TensorInfo],
        *,
        batching: bool = True,
    ) -> None:
        self.state = state
        self.device = state.link.device
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._batching = batching
        self._connection: http.client.HTTPConnection | None = None
        self._expired = threading.Event()  # the running exchange's latency budget is spent
        self.closed = False

    @property
    def inputs(self) -> Sequence[TensorInfo]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[TensorInfo]:
        return self._outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Send the batch to the peer; any failure takes the peer out of the rotation and is
        raised as InferenceError (the instance group then runs the batch elsewhere)."""
        # The socket time-out bounds each read; this bounds the whole exchange, so a peer that
        # dribbles its answer a byte at a time cannot hold the batch past its budget either.
        self._expired = expired = threading.Event()
        watchdog = threading.Timer(self.state.link.timeout_s, self._expire, (expired,))
        watchdog.daemon = True
        watchdog.start()
        try:
            outputs = self._exchange(feeds)
        except Exception as exc:  # whatever the peer sent or did, it is the peer's failure
            self._drop_connection()
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError) or expired.is_set():
                reason = f"no answer within its latency budget ({self.state.link.timeout_s:g} s)"
            self.state.failed(reason)
            raise InferenceError(f"peer {self.state.link.name}: {reason}") from exc
        finally:
            watchdog.cancel()
        if expired.is_set():  # answered just in time, but its socket is shut now
            self._drop_connection()
        self.state.succeeded()
        return outputs

    def _expire(self, expired: threading.Event) -> None:
        """The latency budget is spent: shut the socket, which ends the blocked read."""
        expired.set()
        connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _exchange(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            body, header = encode_request(feeds, binary=True)
        except WireError as exc:
            raise InferenceError(str(exc)) from None
        model = quote(self.state.model, safe="")
        path = self.state.link.path(f"/v2/models/{model}/infer")
        headers = {**self.state.link.headers(), "Content-Type": "application/octet-stream"}
        if header is not None:
            headers[HEADER_LENGTH] = str(header)
        try:
            answer = self._post(path, body, headers)
        except STALE:
            if self._expired.is_set():  # shut by the watchdog, not stale: no second try
                raise
            # A kept-alive connection the peer closed while idle (its keep-alive time-out): the
            # request never reached it. One new connection, like urllib3's retry; a peer that
            # is gone fails on that one.
            self._drop_connection()
            answer = self._post(path, body, headers)
        length = int(answer.getheader("Content-Length") or 0)
        if length > MAX_ANSWER_BYTES:
            raise InferenceError(f"an answer of {length} bytes is over {MAX_ANSWER_BYTES}")
        data = answer.read(MAX_ANSWER_BYTES + 1)  # bounded without a Content-Length too
        if len(data) > MAX_ANSWER_BYTES:
            raise InferenceError(f"an answer of over {MAX_ANSWER_BYTES} bytes")
        if answer.status != 200:
            text = data[:200].decode("utf-8", "replace")
            raise InferenceError(f"HTTP {answer.status}: {text}")
        arrays = decode_response(data, answer.getheader(HEADER_LENGTH)).outputs
        rows = len(next(iter(feeds.values()))) if feeds and self._batching else None
        return conform(arrays, self._outputs, rows)

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
        fresh = self._connection is None
        if self._connection is None:
            self._connection = self.state.link.connect()
        try:
            self._connection.request("POST", path, body, headers)
            return self._connection.getresponse()
        except STALE as exc:
            if fresh:  # not a stale connection: the peer itself hung up
                raise InferenceError(f"the connection was closed: {exc}") from exc
            raise

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- ManagedSession: the scheduler reads ``candidate`` to leave a peer out ---------------
    @property
    def candidate(self) -> PeerBackend | None:
        if not self.state.in_rotation():
            return None
        return PeerBackend(RUNTIME, self.device, self.precision)

    def set_power_mode(self, mode: str) -> None:
        """A peer's power is its own governor's business."""

    def status(self) -> dict[str, Any]:
        shown = self.state.status()
        shown["active"] = (
            {"runtime": RUNTIME, "device": self.device, "precision": self.precision}
            if shown["in_rotation"]
            else None
        )
        return shown

    def close(self) -> None:
        self._drop_connection()
        self.closed = True


def conform(
    arrays: Mapping[str, np.ndarray], expected: Sequence[TensorInfo], rows: int | None
) -> dict[str, np.ndarray]:
    """The peer's outputs under the local names, if each has the local datatype and shape and
    ``rows`` rows; InferenceError otherwise (a wrong answer is never passed on). Outputs are
    matched by name, or by position when the peer names them its own way (a plain ONNX file)."""
    names = [info.name for info in expected]
    if set(names) <= set(arrays):
        ordered = [arrays[name] for name in names]
    elif len(arrays) == len(expected):
        ordered = list(arrays.values())
    else:
        raise InferenceError(f"outputs {', '.join(arrays) or 'none'}, expected {', '.join(names)}")
    result = {}
    for info, array in zip(expected, ordered, strict=True):
        if array.dtype != np.dtype(info.dtype):
            raise InferenceError(f"output {info.name}: {array.dtype.name}, expected {info.dtype}")
        shape = tuple(array.shape)
        fits = len(shape) == len(info.shape) and all(
            want < 0 or want == got or (index == 0 and rows is not None)
            for index, (want, got) in enumerate(zip(info.shape, shape, strict=True))
        )
        if not fits or (rows is not None and shape[:1] != (rows,)):
            raise InferenceError(
                f"output {info.name}: shape {list(shape)}, expected {list(info.shape)} with "
                f"{rows} rows"
            )
        result[info.name] = array
    return result
