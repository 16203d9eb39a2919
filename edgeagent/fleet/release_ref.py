"""A release's identity as outcomes and events name it: model, version, deployment.

An outcome is about one release; the device names it from a verified manifest, an agent
manifest, a recovered pending install or a trust rotation, and the hub matches it to its
deployment row by these three fields. One frozen type, so that every place names a release
the same way (an unknown field is the empty string, as in the outcome message).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ReleaseRef:
    model: str = ""
    version: str = ""
    deployment_id: str = ""

    @classmethod
    def of(cls, release: ReleaseRef | Mapping[str, str]) -> ReleaseRef:
        """``release`` as a ReleaseRef; a mapping's missing fields are empty."""
        if isinstance(release, ReleaseRef):
            return release
        return cls(
            release.get("model", ""), release.get("version", ""), release.get("deployment_id", "")
        )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)
