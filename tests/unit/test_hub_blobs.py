"""The hub's blob stores without a server: a file store's keys never leave its root, store
addresses are parsed or refused with a clear message, and boto3 missing names the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeagent.hub.blobs import (
    BadKey,
    BlobMissing,
    FileBlobStore,
    S3BlobStore,
    S3Settings,
    StoreSettingsError,
    open_store,
    parse_s3_url,
)
from edgeagent.hub.server.samples_settings import SamplesSettings


def test_a_file_store_keeps_images_under_its_root(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "root")
    store.put("digits/1.0.0/dev-a/s1-abc.jpg", b"\xff\xd8\xffone")
    assert store.get("digits/1.0.0/dev-a/s1-abc.jpg") == b"\xff\xd8\xffone"
    store.copy_to("digits/1.0.0/dev-a/s1-abc.jpg", tmp_path / "copy.jpg")
    assert (tmp_path / "copy.jpg").read_bytes() == b"\xff\xd8\xffone"
    assert (tmp_path / "root/digits/1.0.0/dev-a/s1-abc.jpg").stat().st_mode & 0o777 == 0o640
    store.delete("digits/1.0.0/dev-a/s1-abc.jpg")
    store.delete("digits/1.0.0/dev-a/s1-abc.jpg")  # gone already: no error
    with pytest.raises(BlobMissing, match="no image digits/1.0.0/dev-a/s1-abc.jpg"):
        store.get("digits/1.0.0/dev-a/s1-abc.jpg")
    with pytest.raises(BlobMissing):
        store.copy_to("digits/x.jpg", tmp_path / "other.jpg")


@pytest.mark.parametrize(
    "key", ["../outside.jpg", "a/../../outside.jpg", "/etc/passwd", "a//b.jpg", "a/./b", "", "a\\b"]
)
def test_a_file_store_refuses_keys_that_leave_its_root(tmp_path: Path, key: str) -> None:
    store = FileBlobStore(tmp_path / "root")
    for call in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.delete(key),
        lambda: store.copy_to(key, tmp_path / "out"),
    ):
        with pytest.raises(BadKey, match="a relative name without '..'"):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://samples", ("samples", "")),
        ("s3://hub.samples-1/", ("hub.samples-1", "")),
        ("s3://samples/fleet/images/", ("samples", "fleet/images")),
    ],
)
def test_s3_urls_name_a_bucket_and_a_prefix(url: str, expected: tuple[str, str]) -> None:
    assert parse_s3_url(url) == expected


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://samples/x", "expected s3://BUCKET"),
        ("s3://", "expected s3://BUCKET"),
        ("samples", "expected s3://BUCKET"),
        ("s3://Samples", "is not a bucket name"),
        ("s3://ab", "is not a bucket name"),
        ("s3://a..b", "is not a bucket name"),
        ("s3://KEY:SECRET@samples", "no query, fragment or credentials"),
        ("s3://samples?versionId=1", "no query, fragment or credentials"),
        ("s3://samples/a/../b", "the prefix must be a relative name"),
    ],
)
def test_bad_s3_urls_are_refused_clearly(url: str, problem: str) -> None:
    with pytest.raises(StoreSettingsError, match=problem.replace(".", r"\.")):
        parse_s3_url(url)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (S3Settings("s3://samples", "ftp://store:9000"), "http(s)://HOST"),
        (S3Settings("s3://samples", "http://key:secret@store:9000"), "AWS_ACCESS_KEY_ID"),
        (S3Settings("s3://samples", read_timeout_s=0), "must be positive"),
        (S3Settings("s3://samples", max_attempts=0), "at least 1"),
    ],
)
def test_bad_store_options_are_refused(settings: S3Settings, problem: str) -> None:
    with pytest.raises(StoreSettingsError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        settings.validate()


def test_without_boto3_an_s3_store_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 → ImportError
    with pytest.raises(StoreSettingsError, match=r"pip install 'edgeagent\[s3\]'"):
        S3BlobStore(S3Settings("s3://samples", "http://127.0.0.1:9"))


def test_one_place_for_images(tmp_path: Path) -> None:
    both = SamplesSettings(directory=tmp_path, store=S3Settings("s3://samples"))
    with pytest.raises(ValueError, match="--samples-dir and --samples-store"):
        both.validate()
    default = SamplesSettings().blobs(tmp_path)
    assert isinstance(default, FileBlobStore) and default.root == tmp_path / "samples"
    assert isinstance(open_store(tmp_path, None), FileBlobStore)
