"""A small synchronous client of a running agent, over its Unix socket or TCP, for the CLI.

Standard library HTTP only (no event loop, no extra dependency), because CLI commands are short
synchronous programs; tensors are framed by the same v2 codec the server uses, so the two can
never disagree about the wire format.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.api import v2
from edgeagent.engine.errors import InvalidInput


class AgentError(RuntimeError):
    """The agent answered with an error status; ``message`` is its ``{"error": ...}`` text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"agent answered {status}: {message}")
        self.status = status
        self.message = message


class AgentUnreachable(AgentError):
    """No agent answered at the socket or URL (not running, wrong path, no permission)."""

    def __init__(self, where: str, reason: str) -> None:
        RuntimeError.__init__(self, f"cannot reach the agent at {where}: {reason}")
        self.status = 0
        self.message = reason


class _UnixConnection(http.client.HTTPConnection):
    """HTTPConnection over a Unix stream socket (the Host header stays 'localhost')."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentClient:
    """Talk to one agent: give ``socket_path`` or ``url`` (http[s]://host:port)."""

    def __init__(
        self,
        *,
        socket_path: Path | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if (socket_path is None) == (url is None):
            raise ValueError("give exactly one of socket_path and url")
        self.socket_path = socket_path
        self.url = urllib.parse.urlsplit(url) if url else None
        if self.url is not None and (
            self.url.scheme not in ("http", "https") or not self.url.hostname
        ):
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.token = token
        self.timeout = timeout

    @property
    def where(self) -> str:
        return str(self.socket_path) if self.url is None else self.url.geturl()

    def _connection(self) -> http.client.HTTPConnection:
        if self.url is None:
            assert self.socket_path is not None
            return _UnixConnection(self.socket_path, self.timeout)
        kind = (
            http.client.HTTPSConnection
            if self.url.scheme == "https"
            else http.client.HTTPConnection
        )
        return kind(self.url.hostname or "", self.url.port, timeout=self.timeout)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[http.client.HTTPMessage, bytes]:
        """One request; returns (headers, body) of a 2xx answer, raises AgentError otherwise."""
        sent = dict(headers or {})
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        prefix = self.url.path.rstrip("/") if self.url is not None else ""
        connection = self._connection()
        try:
            connection.request(method, prefix + path, body=body, headers=sent)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise AgentUnreachable(self.where, str(exc) or type(exc).__name__) from exc
        finally:
            connection.close()
        if not 200 <= response.status < 300:
            raise AgentError(response.status, _error_text(data, response.reason))
        return response.headers, data

    def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        _, data = self.request(method, path, body, {"Accept": "application/json"})
        try:
            return json.loads(data)
        except ValueError:  # whatever answered is not the agent, or not the agent's API
            raise AgentError(200, f"not a JSON document: {data[:80]!r}") from None

    # ---- the API the CLI uses ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: profile, accelerators, governor, models, updates."""
        return self._json("GET", "/v1/status")

    def models(self) -> list[dict[str, str]]:
        """The repository index: every known model with its state."""
        return self._json("POST", "/v2/repository/index", b"")

    def classify(self, model: str, image: bytes, top_k: int | None = None) -> dict[str, Any]:
        """``POST /v1/models/{model}/classify`` with JPEG or PNG bytes."""
        query = f"?top_k={top_k}" if top_k is not None else ""
        return self._json("POST", f"/v1/models/{_quote(model)}/classify{query}", image)

    def detect(self, model: str, image: bytes) -> dict[str, Any]:
        """``POST /v1/models/{model}/detect`` with JPEG or PNG bytes: boxes, best first."""
        return self._json("POST", f"/v1/models/{_quote(model)}/detect", image)

    def task(self, model: str) -> str:
        """The served model's task (``classification``, ``detection``…), from its config."""
        config = self._json("GET", f"/v2/models/{_quote(model)}/config")
        task = config.get("parameters", {}).get("task", {}).get("string_value")
        return str(task) if task else "classification"  # an agent from before the field

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | None = None,
        binary: bool = True,
        outputs: Sequence[str] | None = None,
    ) -> v2.InferResponse:
        """A v2 inference; tensors travel as binary data unless ``binary`` is False."""
        body, length = v2.encode_request(inputs, binary=binary, outputs=outputs)
        path = f"/v2/models/{_quote(model)}"
        if version is not None:
            path += f"/versions/{_quote(version)}"
        headers = {"Content-Type": "application/octet-stream" if length else "application/json"}
        if length is not None:
            headers[v2.HEADER_LENGTH] = str(length)
        answer_headers, data = self.request("POST", path + "/infer", body, headers)
        try:
            return v2.decode_response(data, answer_headers.get(v2.HEADER_LENGTH))
        except InvalidInput as exc:
            raise AgentError(200, f"malformed infer response: {exc.message}") from exc


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _error_text(data: bytes, reason: str) -> str:
    """The ``error`` field of a JSON error body, else the body or the HTTP reason."""
    try:
        message = json.loads(data)["error"]
        return str(message)
    except (ValueError, KeyError, TypeError):
        return data.decode("utf-8", "replace").strip() or reason
