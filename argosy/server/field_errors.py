"""Every 422 the API answers has one shape: a list of field errors, as FastAPI gives for
a body that fails validation (`[{"loc": ["body", "queue"], "msg": ..., "type": ...}]`),
so a client handles one form whether the body was malformed or names something this
server cannot run (an unknown queue, more nodes than it has).

    raise RefusedError("unknown leaf queue 'x'; known: default", field="queue")
    HTTPException(422, field_errors(err))     # [{"loc": ["body", "queue"], ...}]
"""

from __future__ import annotations

from typing import Any

from argosy.core.errors import ArgosyError


class RefusedError(ArgosyError):
    """A request this server can never carry out; `field` (dotted) is what to change."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def field_errors(err: Exception, field: str | None = None) -> list[dict[str, Any]]:
    """`err` as a one-entry list of field errors, at `field` (else its own, else the body)."""
    where = field if field is not None else getattr(err, "field", "") or ""
    loc = ["body", *where.split(".")] if where else ["body"]
    return [{"loc": loc, "msg": str(err), "type": "value_error"}]
