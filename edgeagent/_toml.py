"""One import point for a TOML reader: the stdlib's on 3.11+, the tomli backport on 3.10."""

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = ["tomllib"]
