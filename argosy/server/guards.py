"""The HTTP guards every request passes: security headers, a same-origin check for
unsafe requests, a cap on request bodies, and validation errors that never echo input.

    install_guards(app, config, upload_caps={("POST", "/sim"): (9 << 20, "sim reports")})

- Every response, errors included, gets SECURITY_HEADERS, a Content-Security-Policy
  that allows only this server's own scripts and styles, and `Cache-Control: no-store`
  (except /static: the console's own scripts and styles).
- An unsafe request (POST, PUT, PATCH, DELETE) to the console, or to the REST API with a
  cookie and no Authorization header, is refused (403) when `Sec-Fetch-Site` is present
  and not `same-origin`, or when `Origin` is present and is not this server's own origin
  (scheme://host:port of the request's Host header; `Origin: null` too). Browsers send
  at least one of the two on every cross-site POST; a client that sends neither is not
  a browser, and CSRF tokens (the console's) and bearer tokens (the API's) still apply.
- A body larger than its cap is answered 413 naming the cap: at once when
  Content-Length says so, else as soon as the streamed bytes pass it; the rest is
  never read into the application.
- A JSON body that is not UTF-8, holds a lone surrogate escape (`"\\udc80"`) or nests
  deeper than any spec is a 422 naming the offset, field or limit
  (`argosy.server.json_text`).
- A 422 keeps FastAPI's shape, `{"detail": [{"type", "loc", "msg", "input", "ctx"}]}`,
  but drops any `input` or `ctx` value longer than ECHO_MAX_CHARS or not writable as
  strict JSON (NaN, infinity).

These are pure ASGI middlewares (no BaseHTTPMiddleware): the body is streamed through,
not buffered (only a JSON body, under its cap, is read whole by the JSON text check),
and the checks cost a few dict lookups per request.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from argosy.core.same_origin import UNSAFE_METHODS, cross_site_reason  # shared with serve
from argosy.server.config import ServerConfig
from argosy.server.json_text import JsonText

CSP = (
    "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
DOCS_CSP = (  # FastAPI's /docs and /redoc load Swagger UI / ReDoc from a CDN, inline
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
    "font-src 'self' https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com "
    "https://cdn.redoc.ly; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}
ECHO_MAX_CHARS = 200
"""Longest `input` or `ctx` value a 422 answer repeats back."""

UploadCaps = Mapping[tuple[str, str], tuple[int, str]]
"""(method, path) -> (cap in bytes, what the cap is called in the 413 message)."""


def install_guards(app: FastAPI, config: ServerConfig, upload_caps: UploadCaps) -> None:
    """Add the guards to `app` (outermost first: headers, origin, body cap, JSON text:
    `argosy.server.json_text`)."""
    app.add_middleware(JsonText)
    app.add_middleware(BodyLimit, default_bytes=config.max_body_bytes, caps=upload_caps)
    app.add_middleware(SameOriginGuard)
    app.add_middleware(SecurityHeaders)
    app.add_exception_handler(RequestValidationError, validation_error)


# ---- answers written by the guards themselves ------------------------------------------
def is_api(path: str) -> bool:
    return path.startswith("/api/")


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    """A short refusal: JSON for the REST API; for the console, a small page (or, for
    htmx, a fragment for the page's #flash area)."""
    headers = {b"connection": b"close"} if status == 413 else {}
    if is_api(scope["path"]):
        body = json.dumps({"detail": message}).encode()
        headers[b"content-type"] = b"application/json"
    elif _header(scope, b"hx-request") == "true":
        body = f'<div class="flash error">{html.escape(message)}</div>'.encode()
        headers |= {b"content-type": b"text/html; charset=utf-8", b"hx-retarget": b"#flash"}
        headers[b"hx-reswap"] = b"innerHTML"
    else:
        page = f"<!doctype html><title>{status}</title><p>{html.escape(message)}</p>\n"
        body = page.encode()
        headers[b"content-type"] = b"text/html; charset=utf-8"
    headers[b"content-length"] = str(len(body)).encode()
    await send({"type": "http.response.start", "status": status, "headers": list(headers.items())})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


# ---- security headers ------------------------------------------------------------------
def _encoded(csp: str, cache: str | None) -> list[tuple[bytes, bytes]]:
    headers = {"content-security-policy": csp, **SECURITY_HEADERS}
    if cache is not None:
        headers["cache-control"] = cache
    return [(k.encode(), v.encode()) for k, v in headers.items()]


PAGE_HEADERS = _encoded(CSP, "no-store")
STATIC_HEADERS = _encoded(CSP, None)  # the console's own scripts and styles may be cached
DOCS_HEADERS = _encoded(DOCS_CSP, "no-store")


def security_headers(path: str) -> list[tuple[bytes, bytes]]:
    if path.startswith("/static/"):
        return STATIC_HEADERS
    return DOCS_HEADERS if path in DOCS_PATHS else PAGE_HEADERS


class SecurityHeaders:
    """Adds the security headers to every HTTP response that lacks them, and answers
    an unhandled error with a plain 500 that has them (the error is still raised, so the
    server logs it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = security_headers(scope["path"])
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {k.lower() for k, _ in message.get("headers", [])}
                added = [(k, v) for k, v in extra if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if not started:
                await refuse(scope, send_with_headers, 500, "internal error; see the server log")
            raise


# ---- same origin (the checks: argosy.core.same_origin) ---------------------------------
def needs_origin_check(path: str, headers: Mapping[str, str]) -> bool:
    """Console requests always; REST requests only when a cookie is their credential."""
    return not is_api(path) or ("cookie" in headers and "authorization" not in headers)


class SameOriginGuard:
    """Refuses (403) unsafe requests that a browser says came from another origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in UNSAFE_METHODS:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            if needs_origin_check(scope["path"], headers):
                reason = cross_site_reason(scope["method"], headers, scope["scheme"])
                if reason is not None:
                    await refuse(scope, send, 403, f"cross-site request refused: {reason}")
                    return
        await self.app(scope, receive, send)


# ---- body cap --------------------------------------------------------------------------
class BodyTooLargeError(HTTPException):
    """Raised from `receive` when the streamed body passes its cap."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


def declared_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class BodyLimit:
    """Caps request bodies: `caps` for named (method, path) pairs, else `default_bytes`."""

    def __init__(self, app: ASGIApp, default_bytes: int, caps: UploadCaps) -> None:
        self.app = app
        self.default = (default_bytes, "max_body_bytes")
        self.caps = dict(caps)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, label = self.caps.get((scope["method"], scope["path"]), self.default)
        message = f"request body over the limit of {limit} bytes ({label})"
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await refuse(scope, send, 413, message)
            return
        await self._streamed(scope, receive, send, limit, message)

    async def _streamed(
        self, scope: Scope, receive: Receive, send: Send, limit: int, message: str
    ) -> None:
        """Counts the bytes as the app reads them; past the cap, whatever the app answers
        (its own error for the failed read) is replaced by the 413."""
        seen, over, started, replaced = 0, False, False, False

        async def counted() -> Message:
            nonlocal seen, over
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True
                    raise BodyTooLargeError(message)
            return msg

        async def guarded(msg: Message) -> None:
            nonlocal started, replaced
            if replaced:
                return  # the rest of the app's own answer
            if over and not started:
                replaced = True
                await refuse(scope, send, 413, message)
                return
            started = True
            await send(msg)

        try:
            await self.app(scope, counted, guarded)
        except BodyTooLargeError:
            if not started and not replaced:
                await refuse(scope, send, 413, message)


# ---- validation errors -----------------------------------------------------------------
def is_short(value: Any) -> bool:
    """Short, and writable as strict JSON in UTF-8: an echoed NaN or infinity (`Infinity`
    is accepted JSON input) or lone surrogate would turn the 422 into a 500."""
    if len(repr(value)) > ECHO_MAX_CHARS:
        return False
    try:
        json.dumps(jsonable_encoder(value), allow_nan=False, ensure_ascii=False).encode()
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def short_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """One validation error with its long `input` and `ctx` values left out."""
    out: dict[str, Any] = {}
    for key, value in error.items():
        if key == "input" and not is_short(value):
            continue
        if key == "ctx" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if is_short(v)}
            if not value:
                continue
        out[key] = value
    return out


async def validation_error(_request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    detail = [short_error(e) for e in err.errors()]
    return JSONResponse({"detail": jsonable_encoder(detail)}, status_code=422)
