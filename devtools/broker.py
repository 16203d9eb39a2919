"""A real Mosquitto for tests and benchmarks: our own process, config, ports, certificates and
persistence.

Two listeners on ephemeral loopback ports:

- plain MQTT, anonymous (most tests);
- TLS with a CA, a server and a client certificate generated here with ``cryptography``;
  it requires the client certificate *and* a username/password (from a password file made with
  ``mosquitto_passwd``), so one test proves all three of the device's broker options.

Persistence is on, so ``restart()`` keeps retained messages and persistent sessions (with
their queued QoS 1 messages) exactly as a production broker restart would.

``bridge_to=other`` makes this broker a bridge to ``other``: everything under ``<prefix>/#``
goes both ways (QoS 1, retained messages kept retained), which is how a site broker joins a
central one — and the path to a broker cluster, where the cluster does this itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from devtools.pki import make_pki
from devtools.ports import free_port
from edgeagent.fleet.settings import MqttSettings

USERNAME = "device"
PASSWORD = "s3cret-for-tests"


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )


def _bridge(remote: Broker, prefix: str, local_port: int) -> str:
    """The config block of a bridge from this broker to ``remote`` (``prefix``/# both ways).

    ``try_private`` tells a remote Mosquitto it talks to a bridge, so it neither echoes our
    messages back (no loop) nor changes their retained flag; ``cleansession false`` keeps the
    bridge's QoS 1 queue across a reconnect of either side.
    """
    return f"""
connection bridge-{local_port}-to-{remote.port}
address 127.0.0.1:{remote.port}
topic {prefix}/# both 1
cleansession false
try_private true
notifications false
restart_timeout 1
"""


PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """mosquitto could not bind a port another process took after ``free_port`` chose it."""


class Broker:
    """One mosquitto process; ``stop()``/``start()``/``restart()`` keep ports and state."""

    def __init__(
        self,
        workdir: Path,
        *,
        bridge_to: Broker | None = None,
        bridge_prefix: str = "edgeagent",
        max_queued_messages: int = 1000,
    ) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise RuntimeError(
                "mosquitto is not installed: run scripts/setup.sh (apt-get install mosquitto)"
            )
        self.binary = binary
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls_port = free_port()
        self.pki = make_pki(workdir / "pki")
        self.log = workdir / "mosquitto.log"
        self.process: subprocess.Popen | None = None
        passwords = workdir / "passwords"
        passwords.write_text("")
        passwords.chmod(0o600)
        subprocess.run(
            ["mosquitto_passwd", "-b", str(passwords), USERNAME, PASSWORD],
            check=True,
            capture_output=True,
        )
        self.config = workdir / "mosquitto.conf"
        self._passwords = passwords
        self._max_queued_messages = max_queued_messages
        self._bridge_to = bridge_to
        self._bridge_prefix = bridge_prefix
        self._started = False  # ports may still change until the first start succeeds
        self._write_config()

    def _write_config(self) -> None:
        """mosquitto.conf for the current ports (rewritten when a port had been taken)."""
        # As root, mosquitto would switch to the "mosquitto" user, who cannot read tmp_path.
        user = "user root\n" if os.geteuid() == 0 else ""
        bridge = ""
        if self._bridge_to is not None:
            bridge = _bridge(self._bridge_to, self._bridge_prefix, self.port)
        self.config.write_text(
            f"""{user}per_listener_settings true
persistence true
persistence_location {self.workdir}/
autosave_interval 1
log_dest file {self.log}
log_type error
log_type warning
log_type notice
log_type information
max_queued_messages {self._max_queued_messages}

listener {self.port} 127.0.0.1
allow_anonymous true
# no cap of its own: the open-files limit the process inherits is the only one
max_connections -1

listener {self.tls_port} 127.0.0.1
allow_anonymous false
password_file {self._passwords}
cafile {self.pki.ca}
certfile {self.pki.server_cert}
keyfile {self.pki.server_key}
require_certificate true
{bridge}"""
        )

    def settings(self, **overrides) -> MqttSettings:
        """Plain-listener settings with fast reconnects for tests."""
        values = {
            "host": "127.0.0.1",
            "port": self.port,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
            "keepalive_s": 5,
            "connect_timeout_s": 3.0,
            **overrides,
        }
        return MqttSettings(**values)

    def tls_settings(self, **overrides) -> MqttSettings:
        values = {
            "port": self.tls_port,
            "tls": True,
            "ca_file": self.pki.ca,
            "cert_file": self.pki.client_cert,
            "key_file": self.pki.client_key,
            "username": USERNAME,
            "password": PASSWORD,
            **overrides,
        }
        return self.settings(**values)

    def start(self) -> None:
        """Start mosquitto and wait until it listens.

        A port from ``free_port`` can be taken by another process before mosquitto binds it;
        before the first successful start (no client knows the ports yet) new ones are drawn.
        """
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_once()
            except PortTaken:
                if self._started or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port, self.tls_port = free_port(), free_port()
                self._write_config()
                continue
            self._started = True
            return

    def _start_once(self) -> None:
        # Listening is judged by mosquitto's own log line, not only by a connection: another
        # process holding the port would accept that connection too.
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(
            [self.binary, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode() if self.process.stderr else ""
                log = self.log.read_text() if self.log.exists() else ""
                fresh = log[offset:] if len(log) >= offset else log
                kind = PortTaken if "Address already in use" in error + fresh else RuntimeError
                raise kind(f"mosquitto exited: {error}\n{log}")
            if self._running_since(offset):
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("mosquitto did not start listening within 10 s")

    def _running_since(self, offset: int) -> bool:
        """Whether the log says, after ``offset``, that mosquitto opened its listeners."""
        try:
            with self.log.open("rb") as log:
                log.seek(offset)
                return b" running" in log.read()
        except FileNotFoundError:
            return False

    def stop(self) -> None:
        """SIGTERM, like a service stop: mosquitto saves its persistence file first."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()
