"""The hub server's settings: where it listens, which database, and every limit it enforces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.fleet.manifest import MAX_TARGETS
from edgeagent.fleet.settings import MqttSettings
from edgeagent.hub.policy.staged import MAX_STAGES
from edgeagent.hub.server.samples_settings import SamplesSettings
from edgeagent.netaddr import is_loopback
from edgeagent.paths import default_state_dir
from edgeagent.tls import TlsMode, TlsSettings, plain_listener_problem

MAX_CHART_POINTS = 100_000  # more is a typo: each point is a row read for every device page


def default_database_url(state_dir: Path | None = None) -> str:
    """One SQLite file under the hub's state directory: nothing to install for a small fleet."""
    return f"sqlite+aiosqlite:///{(state_dir or default_state_dir() / 'hub') / 'hub.db'}"


def normalise_database_url(url: str) -> str:
    """Accept the plain spellings an operator types (``sqlite:///…``, ``postgresql://…``) and
    pick the asyncio driver for them, so one code path serves both databases."""
    for plain, driver in (
        ("sqlite://", "sqlite+aiosqlite://"),
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
    ):
        if url.startswith(plain):
            return driver + url[len(plain) :]
    if url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        return url
    raise ValueError(f"--db {url!r}: expected sqlite:///PATH or postgresql://USER@HOST/DB")


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``hub server`` needs; each limit has a flag of the same name."""

    database_url: str = field(default_factory=default_database_url)
    host: str = "127.0.0.1"
    port: int = 8400
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    token_file: Path | None = None  # "SCOPE TOKEN" lines; required off loopback
    retention_days: float = 30.0  # event history older than this is deleted
    prune_interval_s: float = 600.0  # how often the retention sweep runs
    max_report_bytes: int = 64 * 1024  # bigger device messages are skipped unread
    max_body_bytes: int = 256 * 1024  # REST request bodies (a release envelope is tiny)
    page_size: int = 100  # default page of /devices
    max_page_size: int = 1000  # the largest page a client may ask for
    max_wait_s: float = 3600.0  # cap on a stage's in-progress time-out and on rollout waits
    ingest_queue: int = 10_000  # reports waiting for the database before the broker is paused
    ingest_batch: int = 500  # reports stored per transaction
    send_batch: int = 100  # devices one recorded (signed) envelope is for; each sent is committed
    lease_s: float = 6.0  # the controller's lease: another replica takes over this long after
    lease_renew_s: float = 2.0  # how often the leader renews it (and followers try to take it)
    max_stages: int = MAX_STAGES  # stages of one deployment (each is a row in every answer)
    max_device_ids: int = 10_000  # one deployment's explicit device list (a group names more)
    chart_points: int = 288  # state reports a device page charts (a day of 5-minute heartbeats)
    release_keys: tuple[Path, ...] = ()  # sign each stage batch's envelope with these
    trust_file: Path | None = None  # uploads are verified against it; required with release_keys
    state_dir: Path = field(default_factory=lambda: default_state_dir() / "hub")  # admin.token
    open: bool = False  # no tokens at all: anyone who reaches the port is admin (loopback only)
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides the listener's own
    tls: TlsSettings = field(default_factory=TlsSettings)  # --tls-cert / -key / -client-ca
    tls_mode: TlsMode = "auto"  # --tls off: plain HTTP off loopback (a TLS proxy in front)
    samples: SamplesSettings = field(default_factory=SamplesSettings)  # devices' captured samples

    def validate(self) -> None:
        normalise_database_url(self.database_url)
        checks = [
            (0 <= self.port <= 65535, "--port must be 0..65535 (0: any free port)"),
            (self.retention_days > 0, "--retention-days must be positive"),
            (self.prune_interval_s > 0, "--prune-interval must be positive"),
            (self.max_report_bytes > 0, "--max-report-bytes must be positive"),
            (self.max_body_bytes > 0, "--max-body-bytes must be positive"),
            (0 < self.page_size <= self.max_page_size, "--page-size must be 1..--max-page-size"),
            (self.max_wait_s > 0, "--max-wait must be positive"),
            (self.ingest_queue > 0, "--ingest-queue must be positive"),
            (self.ingest_batch > 0, "--ingest-batch must be positive"),
            (self.send_batch > 0, "--send-batch must be positive"),
            (self.lease_renew_s > 0, "--lease-renew must be positive"),
            (
                self.lease_s >= 2 * self.lease_renew_s,
                "--lease must be at least twice --lease-renew (a renewal may be late once "
                "without the leader losing its lease)",
            ),
            (
                0 < self.max_stages <= MAX_STAGES,
                f"--max-stages must be 1..{MAX_STAGES} (more is a typo, not a rollout)",
            ),
            (self.max_device_ids > 0, "--max-device-ids must be positive"),
            (
                2 <= self.chart_points <= MAX_CHART_POINTS,
                f"--chart-points must be 2..{MAX_CHART_POINTS} (a chart needs two points; "
                "each one is a row the device page reads)",
            ),
            (
                not self.release_keys or self.send_batch <= MAX_TARGETS,
                f"--send-batch must be at most {MAX_TARGETS} with --release-key (one signed "
                "envelope names the batch's devices)",
            ),
            (
                not (self.open and self.token_file),
                "--open and --token-file contradict each other: keep one",
            ),
            (
                not self.release_keys or self.trust_file is not None,
                "--release-key needs --trust FILE, the trust file devices verify against (e.g. "
                "KEYS/trust.json beside the release key): the server signs only uploads that "
                "verify against it, or anyone who can upload would have the fleet's key sign "
                "their release",
            ),
            (
                self.token_file is not None or is_loopback(self.host),
                f"listening on {self.host} needs --token-file (bearer tokens with scopes)",
            ),
        ]
        plain = plain_listener_problem(self.host, self.tls_mode, self.tls)
        checks += [
            (
                (self.tls.cert_file is None) == (self.tls.key_file is None),
                "--tls-cert and --tls-key go together",
            ),
            (
                self.tls.client_ca_file is None or self.tls.cert_file is not None,
                "--tls-client-ca needs --tls-cert and --tls-key",
            ),
            (plain is None, (plain or "").replace('tls = "off"', "--tls off")),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.mqtt.validate()
        self.samples.validate()
