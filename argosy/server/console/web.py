"""What every console page shares: templates, the session cookie, the viewer, and the
route class that turns any error into a message on the page (never a stack trace).

    @router.get("/queues")
    async def queues(request: Request, who: Viewer) -> HTMLResponse:
        return render(request, "queues.html", who, rows=...)

The cookie holds a session id (`argosy.server.sessions`), never an API token. A request
without a live session is sent to /login (htmx requests get an `HX-Redirect`). An unsafe
request (POST, ...) must also send the session's CSRF token, as the `csrf` form field
or the `X-CSRF-Token` header (htmx sends it from <body hx-headers>); a missing or wrong
one is refused with 403 before the handler runs. Errors raised by a handler become the
error page, or, for an htmx request, a message swapped into the page's `#flash` area.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException  # FastAPI's is a subclass
from starlette.requests import ClientDisconnect

from argosy.core.errors import ArgosyError
from argosy.server.auth import Principal
from argosy.server.control import Control
from argosy.server.guards import UNSAFE_METHODS
from argosy.server.job_json import number
from argosy.server.rate_limits import refuse_if_too_fast
from argosy.server.sessions import Session

COOKIE = "argosy_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
TEMPLATES.env.filters["utc"] = lambda t: (
    datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t is not None else ""
)
TEMPLATES.env.filters["num"] = lambda value, fmt, scale=1: (
    fmt % (value * scale) if number(value) is not None else "-"
)  # a figure a job wrote: formatted when it is a finite number, else "-"
TEMPLATES.env.filters["pairs"] = lambda value: value.items() if isinstance(value, dict) else ()
TEMPLATES.env.filters["count_of"] = lambda value: len(value) if isinstance(value, list) else "-"
log = logging.getLogger("argosy.console")


class LoginRequiredError(Exception):
    """No session cookie, or one that is unknown, expired, or whose token was revoked."""


class ConsoleError(Exception):
    """A user-facing error: shown as a message with its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class CsrfError(ConsoleError):
    """An unsafe request without its session's CSRF token: refused with 403."""

    def __init__(self) -> None:
        super().__init__(
            "refused: this form's CSRF token is missing or out of date (a form from "
            "another site, or from before you logged in again); reload the page",
            403,
        )


def current_session(request: Request) -> Session | None:
    """The live session of the request's cookie (looked up once per request)."""
    if not hasattr(request.state, "session"):
        session_id = request.cookies.get(COOKIE, "")
        found = request.app.state.sessions.get(session_id) if session_id else None
        request.state.session = found
        if found is not None:
            request.state.actor = found.principal.actor  # the access log's actor
    return request.state.session


async def check_csrf(request: Request, session: Session) -> None:
    """The request's CSRF token (header, else form field) must be the session's."""
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        value = (await request.form()).get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise CsrfError


async def viewer(request: Request) -> Principal:
    """Who the session is; for an unsafe request, only with the session's CSRF token."""
    session = current_session(request)
    if session is None:
        raise LoginRequiredError
    if request.method in UNSAFE_METHODS:
        await check_csrf(request, session)
        refuse_if_too_fast(request, session.principal)
    return session.principal


def control(request: Request) -> Control:
    return request.app.state.control


Viewer = Annotated[Principal, Depends(viewer)]
Ctl = Annotated[Control, Depends(control)]


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def render(
    request: Request, template: str, who: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    session = getattr(request.state, "session", None)
    context |= {"who": who, "path": request.url.path, "csrf": session.csrf if session else ""}
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status)


def flash(
    request: Request, message: str, status: int, kind: str = "error", htmx_status: int = 200
) -> Response:
    """An error or notice: a fragment into #flash for htmx (200 unless told: htmx swaps
    2xx answers, and 403 and 413 as base.html configures it), else the error page."""
    if is_htmx(request):
        headers = {"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"}
        html = TEMPLATES.get_template("_flash.html").render(message=message, kind=kind)
        return HTMLResponse(html, status_code=htmx_status, headers=headers)
    return render(request, "error.html", None, status=status, message=message)


def to_login(request: Request) -> Response:
    target = "/login?next=" + quote(request.url.path)
    if is_htmx(request):
        return Response(status_code=204, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class ConsoleRoute(APIRoute):
    """An APIRoute whose failures render as pages: login redirect, messages for user
    errors (4xx), and a plain 'internal error' message (logged with its traceback)."""

    def get_route_handler(self) -> Handler:
        inner = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await inner(request)
            except LoginRequiredError:
                return to_login(request)
            except CsrfError as err:
                return flash(request, str(err), 403, htmx_status=403)
            except ConsoleError as err:
                return flash(request, str(err), err.status)
            except HTTPException as err:
                return flash(request, _detail(err.detail), err.status_code)
            except RequestValidationError as err:
                return flash(request, _detail(list(err.errors())), 422)
            except ArgosyError as err:
                return flash(request, str(err), 422)
            except ClientDisconnect:
                return Response(status_code=400)  # no one is left to read an answer
            except Exception as err:
                log.exception("console page %s failed", request.url.path)
                return flash(request, f"internal error ({type(err).__name__}); see the log", 500)

        return handler


def _detail(detail: Any) -> str:
    """FastAPI's validation details (a list of dicts) as one readable line."""
    if isinstance(detail, list):
        parts = []
        for item in detail:
            loc = ".".join(str(p) for p in item.get("loc", ()) if p not in ("query", "body"))
            parts.append(f"field '{loc}': {item.get('msg', '')}")
        return "; ".join(parts)
    return str(detail)
