"""Domain errors of the dataflow service; the HTTP layer maps them to status codes."""

from __future__ import annotations

from astraflow.errors import AstraFlowError


class DataflowError(AstraFlowError):
    status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotFound(DataflowError):
    """An id (node, lease, batch, evaluation) the service does not know: HTTP 404."""

    status = 404


class Invalid(DataflowError):
    """A well-formed body whose values the service cannot use: HTTP 422, naming the field."""

    status = 422


class Forbidden(DataflowError):
    """A caller acting on something that is not its own (another node): HTTP 403."""

    status = 403


class Conflict(DataflowError):
    """A request that contradicts an earlier one (an idempotency key reused with another body):
    HTTP 409, naming the key."""

    status = 409


class TooMany(DataflowError):
    """A bound on what callers may hold was reached (active nodes): HTTP 429, naming the bound."""

    status = 429
