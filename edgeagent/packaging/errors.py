"""The one error the packager raises: it names the file and what to pass instead."""

from __future__ import annotations


class PackagingError(ValueError):
    """A source or option the packager cannot use; the message says which flag fixes it."""
