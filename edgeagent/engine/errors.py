"""Serving errors: one exception type per HTTP outcome, raised by the engine, mapped by the API.

The engine (registry, batching) knows nothing about HTTP, but every failure it reports has
exactly one right status for a client (SPEC §5), so the status travels with the exception and the
HTTP layer only turns ``ServingError`` into ``{"error": message}`` with that status (plus
``Retry-After`` when ``retry_after`` is set). Anything that is not a ServingError is a bug (500).
"""

from __future__ import annotations


class ServingError(Exception):
    """A request the agent refuses or cannot finish; ``status`` is the HTTP status to answer."""

    status: int = 500

    def __init__(self, message: str, status: int | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.retry_after = retry_after

    def to_json(self) -> dict[str, str]:
        """The response body every error has (SPEC §5)."""
        return {"error": self.message}


class InvalidInput(ServingError):
    """The request itself is wrong: shape, dtype, element count, JSON, image (names the tensor)."""

    status = 400


class ModelNotFound(ServingError):
    """No such model, or no such version of it."""

    status = 404


class PayloadTooLarge(ServingError):
    """The body exceeds ``[server] max_body_bytes``."""

    status = 413


class QueueFull(ServingError):
    """The model's bounded queue is full: back-pressure, the client should slow down."""

    status = 429

    def __init__(self, message: str, retry_after: int | None = 1):
        super().__init__(message, retry_after=retry_after)


class NotReady(ServingError):
    """The model exists but cannot serve now (loading, unloading, failed, shutting down)."""

    status = 503


class Throttled(ServingError):
    """The governor sheds this request (heat, power); retry after ``retry_after`` seconds."""

    status = 503

    def __init__(self, message: str, retry_after: int = 5):
        super().__init__(message, retry_after=retry_after)


class LoadFailed(ServingError):
    """A model (version) could not be opened or failed its warm-up; the old version serves on."""

    status = 500


class DeadlineExceeded(ServingError):
    """The request's deadline passed before its answer was ready."""

    status = 504
