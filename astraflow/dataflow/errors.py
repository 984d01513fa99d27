"""Domain errors of the dataflow service; the HTTP layer maps them to status codes."""

from __future__ import annotations


class DataflowError(Exception):
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
