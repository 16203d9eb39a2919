"""Device upload tokens: which device (and group) an upload's bearer token speaks for.

A file the operator writes, one ``DEVICE_ID GROUP TOKEN`` a line (``#`` comments), apart from
the hub's read/admin tokens: a device's token lets it upload its own samples and nothing else,
so a stolen device token can neither read the fleet nor pose as another device.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from edgeagent.fleet.samples import NAME_RE
from edgeagent.fsutil import SecretFileError, read_secret_file

MIN_TOKEN_CHARS = 16


class DeviceTokenError(ValueError):
    pass


@dataclass(frozen=True)
class Uploader:
    device_id: str
    group: str


@dataclass(frozen=True)
class DeviceTokens:
    by_token: dict[str, Uploader]

    @classmethod
    def load(cls, path: Path) -> DeviceTokens:
        try:
            text = read_secret_file(path).decode("utf-8")
        except (SecretFileError, UnicodeDecodeError, OSError) as exc:
            raise DeviceTokenError(f"{path}: {exc}") from exc
        found: dict[str, Uploader] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 3 or not NAME_RE.match(parts[0]) or len(parts[2]) < MIN_TOKEN_CHARS:
                raise DeviceTokenError(
                    f"{path}:{number}: expected 'DEVICE_ID GROUP TOKEN' with a token of at "
                    f"least {MIN_TOKEN_CHARS} characters"
                )
            found[parts[2]] = Uploader(parts[0], parts[1])
        return cls(found)

    def uploader(self, header: str) -> Uploader | None:
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None
        given = presented.strip().encode("utf-8", "surrogatepass")
        match = None
        for token, uploader in self.by_token.items():
            if hmac.compare_digest(token.encode(), given):
                match = uploader
        return match
