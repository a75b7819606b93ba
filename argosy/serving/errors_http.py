"""Every error of the serving API as OpenAI's error object, with the right status.

400: an invalid field (`param` names it), malformed JSON, a prompt too long for the context
or `max_prompt_chars`, an `ArgosyError` raised while the engine builds a request (a
proposer it cannot build, for instance: a mistake in the request or a setting, never a
500); 401: a wrong admin token; 404: an unknown model or route (`model_not_found` /
`not_found`); 405: a wrong method; 413: a body over `max_body_bytes` (`BodyLimit`); 429:
too many requests in flight (`Retry-After`); 500: the engine failed; 503: the engine
sleeps (`Retry-After`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from argosy.core.errors import ArgosyError, UnknownNameError
from argosy.serving.admin import AdminDeniedError
from argosy.serving.errors import EngineAsleepError, EngineFailedError
from argosy.serving.limits import QueueFullError, ServingLimits
from argosy.serving.shapes import error_body


class ApiError(Exception):
    """A client error with the field it concerns."""

    def __init__(
        self, status: int, message: str, param: str | None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def install_error_handlers(app: FastAPI, limits: ServingLimits) -> None:
    """Map every error the routes raise to OpenAI's shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.message, err.param, err.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        if first.get("type") == "json_invalid":
            return error_response(400, f"malformed JSON: {first.get('msg')}", "body")
        param, message = _field_of(first)
        return error_response(400, f"{param}: {message}", param)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        code = "not_found" if err.status_code == 404 else None
        return error_response(err.status_code, str(err.detail), None, code)

    @app.exception_handler(AdminDeniedError)
    async def denied(_: Request, err: AdminDeniedError) -> JSONResponse:
        return error_response(err.status, err.message, "authorization")

    @app.exception_handler(QueueFullError)
    async def full(_: Request, err: QueueFullError) -> JSONResponse:
        headers = {"Retry-After": str(err.retry_after_s)}
        return error_response(429, str(err), None, "queue_full", headers)

    @app.exception_handler(EngineAsleepError)
    async def asleep(_: Request, err: EngineAsleepError) -> JSONResponse:
        headers = {"Retry-After": str(limits.asleep_retry_after_s)}
        return error_response(503, str(err), None, "engine_asleep", headers)

    @app.exception_handler(EngineFailedError)
    async def failed(_: Request, err: EngineFailedError) -> JSONResponse:
        return error_response(500, str(err), None)

    @app.exception_handler(UnknownNameError)
    async def unknown(_: Request, err: UnknownNameError) -> JSONResponse:
        return error_response(400, str(err), None)

    @app.exception_handler(ArgosyError)
    async def refused(_: Request, err: ArgosyError) -> JSONResponse:
        return error_response(400, str(err), getattr(err, "field", None))

    @app.exception_handler(ValueError)
    async def value(_: Request, err: ValueError) -> JSONResponse:
        return error_response(400, str(err), None)


def _field_of(error: dict[str, object]) -> tuple[str, str]:
    """The field a validation error concerns and its message; a model-level check names
    its field as the prefix of its message (`"prompt: must not be empty"`)."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]  # type: ignore[attr-defined]
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    if not loc and ": " in message:
        field, _, rest = message.partition(": ")
        if field.isidentifier():
            return field, rest
    # a union's branch names (`str`, `list[int]`, ...) are not fields
    path = [p for p in loc if "[" not in p and p not in _BRANCHES]
    return ".".join(path) or "body", message


_BRANCHES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def error_response(
    status: int,
    message: str,
    param: str | None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-shaped error response."""
    return JSONResponse(error_body(status, message, param, code), status, headers=headers)
