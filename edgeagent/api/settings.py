"""[server] listener keys: Unix socket, TCP listener, who may call it, and the limits per listener.

The engine's keys share the [server] table for compatibility and live in
``edgeagent.engine.settings``; ``edgeagent.config`` hands each class its own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from edgeagent.aio import uvloop_installed
from edgeagent.api.secret_files import (
    ADMIN_TOKEN_CREDENTIAL,
    TOKEN_CREDENTIAL,
    credential,
    read_secret,
)
from edgeagent.netaddr import is_loopback
from edgeagent.paths import default_socket_path
from edgeagent.sections import computed_setting, require, setting
from edgeagent.tls import TlsMode


def _token_ok(token: str) -> bool:
    """Visible ASCII only: anything else cannot travel in an Authorization header reliably."""
    return all(33 <= ord(c) <= 126 for c in token)


@dataclass(frozen=True)
class ServerSettings:
    """[server] listener keys: where the API listens, who may call it, what a client may cost."""

    unix_socket: Path | None = computed_setting(
        default_socket_path,
        "Unix socket of the API: $RUNTIME_DIRECTORY/agent.sock under systemd, else "
        "$XDG_RUNTIME_DIR/edgeagent/agent.sock, else /tmp/edgeagent-$UID/agent.sock",
    )
    socket_mode: int = setting(
        0o660, "permissions of the socket (group edgeagent may connect)", "octal mode"
    )
    tcp_host: str = setting("127.0.0.1", "TCP listen address")
    tcp_port: int = setting(8080, "TCP port; 0 disables the TCP listener")
    tls: TlsMode = setting(
        "auto",
        "auto: HTTPS with the [tls] certificate when one is set, else plain HTTP (refused on "
        'a non-loopback tcp_host); "off": plain HTTP wherever it listens (a TLS-terminating '
        "proxy in front)",
    )
    tcp_auth: Literal["token", "none"] = setting(
        "token",
        "token: every TCP request needs Authorization: Bearer <token>, loopback included; "
        '"none": inference and reads over loopback TCP are open (load/unload never are)',
    )
    token: str = setting(
        "", "bearer token for TCP requests; unset = TCP refuses everyone", secret=True
    )
    admin_token: str = setting(
        "",
        "bearer token for repository load/unload over TCP; unset = Unix socket only",
        secret=True,
    )
    token_file: Path | None = computed_setting(
        partial(credential, TOKEN_CREDENTIAL),
        "file holding the token (whitespace stripped), read at start, instead of token; "
        f"default: the systemd credential {TOKEN_CREDENTIAL} when the unit passes one "
        "(LoadCredential=), else unset",
    )
    admin_token_file: Path | None = computed_setting(
        partial(credential, ADMIN_TOKEN_CREDENTIAL),
        "file holding the admin token, read at start, instead of admin_token; default: the "
        f"systemd credential {ADMIN_TOKEN_CREDENTIAL} when the unit passes one, else unset",
    )
    allowed_hosts: list[str] = computed_setting(
        list, "extra Host header names the TCP listener answers to (DNS rebinding guard)"
    )
    deepstack_model: str = setting(
        "", "detection model that answers DeepStack's POST /v1/vision/detection (empty: none)"
    )
    deepstack_max_predictions: int = setting(
        20,
        "most predictions one DeepStack answer carries, best first (Frigate's deepstack "
        "detector fills a fixed 20-row array and fails on more)",
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024, "largest request body accepted (413 above)", "bytes"
    )
    max_connections: int = setting(
        100, "connections one listener holds at once; more are answered 503 and closed"
    )
    header_timeout_s: float = setting(
        15.0, "a request head must be complete this long after the last request", "s"
    )
    body_timeout_s: float = setting(
        10.0, "grace before a body must arrive at body_min_bytes_per_s", "s"
    )
    body_min_bytes_per_s: int = setting(
        64 * 1024, "slowest body upload accepted after body_timeout_s (408 below)", "bytes/s"
    )
    send_timeout_s: float = setting(
        30.0, "a client that reads none of its answer this long is dropped", "s"
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = setting(
        "asyncio",
        "the daemon's event loop: uvloop (the [uvloop] extra) spends less CPU per request, but "
        "holds two descriptors per connection it admits (it duplicates the socket); "
        "auto = uvloop where installed",
    )
    max_decoding_bytes: int = setting(
        64 * 1024 * 1024,
        "request bytes read and decoded at once per listener (JSON counts 4x); 503 above",
        "bytes",
    )

    json_helper_max_bytes: int = setting(
        16 * 1024 * 1024,
        "largest JSON part of an infer request parsed in the JSON helper process, outside the "
        "daemon's GIL (started at the first JSON part over 256 kB; its shared memory grows to "
        "what the largest body needs, up to 5x this); larger ones, and all with 0, are parsed "
        "on a thread of the daemon",
        "bytes",
    )

    def __post_init__(self) -> None:
        """Read each token file into its token, so every listener sees one token either way.

        Construction is where the file is read (once per config load or reload, like the
        config itself); a copy made with ``dataclasses.replace`` reads it again and finds the
        same token it already holds, so only a token written both in the config and in a
        file is refused.
        """
        for key in ("token", "admin_token"):
            path: Path | None = getattr(self, f"{key}_file")
            if path is None:
                continue
            secret = read_secret(path, "server", f"{key}_file")
            if secret is None:
                continue
            inline = getattr(self, key)
            require(
                not inline or inline == secret,
                "server",
                key,
                f"is set here and in {key}_file ({path}): keep one (the file keeps it out of "
                "this config)",
            )
            object.__setattr__(self, key, secret)

    def validate(self) -> None:
        require(0 <= self.tcp_port <= 65535, "server", "tcp_port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "server", "socket_mode", "must be 0..0o777")
        require(self.max_body_bytes > 0, "server", "max_body_bytes", "must be positive")
        for key in ("token", "admin_token"):
            require(
                _token_ok(getattr(self, key)), "server", key, "must be visible ASCII characters"
            )
        require(
            not self.token or self.token != self.admin_token,
            "server",
            "admin_token",
            "must differ from [server] token, or the two scopes are one",
        )
        require(
            self.tcp_port == 0 or self.tcp_auth == "token" or is_loopback(self.tcp_host),
            "server",
            "tcp_auth",
            f"'none' is only allowed on a loopback tcp_host, not {self.tcp_host!r}",
        )
        require(
            self.tcp_port == 0 or is_loopback(self.tcp_host) or bool(self.token),
            "server",
            "token",
            f"must be set when TCP listens on the non-loopback address {self.tcp_host!r}",
        )
        require(
            self.event_loop != "uvloop" or uvloop_installed(),
            "server",
            "event_loop",
            "uvloop is not installed (pip install 'edgeagent[uvloop]')",
        )
        require(self.max_connections >= 1, "server", "max_connections", "must be at least 1")
        require(
            self.deepstack_max_predictions >= 1,
            "server",
            "deepstack_max_predictions",
            "must be at least 1",
        )
        for key in ("header_timeout_s", "body_timeout_s", "send_timeout_s"):
            require(getattr(self, key) > 0, "server", key, "must be positive")
        require(
            self.json_helper_max_bytes >= 0,
            "server",
            "json_helper_max_bytes",
            "must not be negative",
        )
        require(self.body_min_bytes_per_s > 0, "server", "body_min_bytes_per_s", "must be positive")
        require(
            self.max_decoding_bytes >= self.max_body_bytes,
            "server",
            "max_decoding_bytes",
            "must be at least max_body_bytes (one largest request must fit)",
        )
