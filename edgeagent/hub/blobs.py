"""Where the hub keeps sample images: a directory, or a bucket of an S3-compatible store.

One interface (``BlobStore``) for everything that writes or reads an image — the server's
upload route, the dashboard's image route, ``hub export`` and ``hub train`` — so the choice is
made once, at start (``open_store``), and the callers never look at paths or buckets.

The methods block (file or network I/O): the server calls them through ``asyncio.to_thread``.
A key is a relative, ``/``-separated name (``<model>/<version>/<device>/<id>-<sha>.jpg``); one
with ``..``, an absolute path or an empty part is refused by both stores, so a row of the
database can never name a file outside the samples directory. The S3 store uses boto3, whose
standard chain supplies the credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a
profile, an instance role): they never appear on a command line or in a URL.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from edgeagent.fsutil import write_file_atomic

S3_EXTRA = "pip install 'edgeagent[s3]'"
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3
IMAGE_MODE = 0o640


class BlobError(Exception):
    """Anything a store refuses; the subclasses say whether trying again can help."""


class BadKey(BlobError, ValueError):
    """A key that would leave the store's root (``..``, absolute, empty parts)."""


class BlobMissing(BlobError):
    """No object under this key."""


class StoreUnavailable(BlobError):
    """The store did not answer, or refused (credentials, a missing bucket): retryable."""


class StoreSettingsError(BlobError, ValueError):
    """A store address or option that cannot be used (or boto3 missing for ``s3://``)."""


class BlobStore(Protocol):
    description: str  # for logs and errors: the directory, or s3://bucket/prefix

    def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers (called once, at start)."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` whole or not at all."""

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None:
        """Remove ``key``; no error if it is not there."""

    def copy_to(self, key: str, path: Path) -> None:
        """Write the object of ``key`` to the local file ``path``."""


def checked_key(key: str) -> str:
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or "\\" in key
        or "\0" in key
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise BadKey(f"blob key {key!r}: a relative name without '..', '.' or empty parts")
    return key


class FileBlobStore:
    """The images as files under ``root`` (each written atomically: temp file, fsync, rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = str(root)

    def _path(self, key: str) -> Path:
        return self.root / checked_key(key)

    def check(self) -> None:
        """Nothing to reach: the directory is made by the first ``put``."""

    def put(self, key: str, data: bytes) -> None:
        write_file_atomic(self._path(key), data, IMAGE_MODE)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"no image {key} under {self.root}") from None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def copy_to(self, key: str, path: Path) -> None:
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError:
            raise BlobMissing(f"no image {key} under {self.root}") from None


@dataclass(frozen=True)
class S3Settings:
    """``--samples-store s3://BUCKET/PREFIX`` and its connection's bounds."""

    url: str
    endpoint: str | None = None  # an S3-compatible store's URL; None = AWS
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S
    max_attempts: int = MAX_ATTEMPTS  # boto3's own retries of one call, the first included

    def validate(self) -> None:
        parse_s3_url(self.url)
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise StoreSettingsError(f"--s3-endpoint {self.endpoint!r}: http(s)://HOST[:PORT]")
            if parts.username or parts.password:
                raise StoreSettingsError(
                    "--s3-endpoint must not hold credentials: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment"
                )
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise StoreSettingsError("--s3-connect-timeout and --s3-read-timeout must be positive")
        if self.max_attempts < 1:
            raise StoreSettingsError("--s3-max-attempts must be at least 1")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` → (bucket, prefix without surrounding slashes)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise StoreSettingsError(f"--samples-store {url!r}: expected s3://BUCKET[/PREFIX]")
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise StoreSettingsError(f"--samples-store {url!r}: no query, fragment or credentials")
    if not BUCKET_RE.match(parts.netloc) or ".." in parts.netloc:
        raise StoreSettingsError(
            f"--samples-store {url!r}: {parts.netloc!r} is not a bucket name (3-63 characters: "
            "lower-case letters, digits, '.' and '-')"
        )
    prefix = parts.path.strip("/")
    if prefix:
        try:
            checked_key(prefix)
        except BadKey:
            raise StoreSettingsError(
                f"--samples-store {url!r}: the prefix must be a relative name without '..', "
                "'.' or empty parts"
            ) from None
    return parts.netloc, prefix


class S3BlobStore:
    """The images as objects of one bucket (under a prefix), through boto3.

    A single PUT is atomic in S3: the object appears whole or not at all. Every failure to
    reach the store or a refusal by it becomes ``StoreUnavailable`` once boto3's own bounded
    retries are spent (``max_attempts``, each under the connect and read time-outs).
    """

    def __init__(self, settings: S3Settings) -> None:
        settings.validate()
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise StoreSettingsError(f"s3:// needs boto3 ({exc}): {S3_EXTRA}") from exc
        self.bucket, self.prefix = parse_s3_url(settings.url)
        self.description = settings.url
        config = Config(
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},
            # S3-compatible stores (SeaweedFS, MinIO, Ceph) address buckets by path
            s3={"addressing_style": "path"} if settings.endpoint else None,
        )
        self._client: Any = boto3.session.Session().client(
            "s3", endpoint_url=settings.endpoint, config=config
        )

    def _key(self, key: str) -> str:
        checked_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unavailable(self, doing: str, exc: Exception) -> StoreUnavailable:
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            reason = "has no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        elif isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "?"))
            reason = f"refused ({code}: {error.get('Message', '')})"
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                reason += "; check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            elif code in ("404", "NoSuchBucket"):
                reason = f"has no bucket {self.bucket!r}"
        else:
            reason = f"cannot be reached ({exc})"
        return StoreUnavailable(f"{doing} {self.description}: the store {reason}")

    def _call(self, doing: str, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, method)(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if method == "get_object" and code in ("NoSuchKey", "404"):
                raise BlobMissing(f"no object {kwargs.get('Key')} in {self.description}") from exc
            raise self._unavailable(doing, exc) from exc
        except BotoCoreError as exc:
            raise self._unavailable(doing, exc) from exc

    def check(self) -> None:
        self._call("checking", "head_bucket", Bucket=self.bucket)

    def put(self, key: str, data: bytes) -> None:
        self._call(
            "storing in",
            "put_object",
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
            ContentType="image/jpeg",
        )

    def get(self, key: str) -> bytes:
        answer = self._call("reading from", "get_object", Bucket=self.bucket, Key=self._key(key))
        from botocore.exceptions import BotoCoreError

        try:
            return bytes(answer["Body"].read())
        except BotoCoreError as exc:  # the connection broke mid-body
            raise self._unavailable("reading from", exc) from exc

    def delete(self, key: str) -> None:
        self._call("deleting from", "delete_object", Bucket=self.bucket, Key=self._key(key))

    def copy_to(self, key: str, path: Path) -> None:
        path.write_bytes(self.get(key))


def open_store(directory: Path, s3: S3Settings | None) -> BlobStore:
    """The store chosen at start: the bucket of ``s3`` when given, else ``directory``."""
    return S3BlobStore(s3) if s3 is not None else FileBlobStore(directory)
