"""What every console page shares: templates, the login cookie, the viewer, and the
route class that turns any error into a message on the page (never a stack trace).

    @router.get("/queues")
    async def queues(request: Request, who: Viewer) -> HTMLResponse:
        return render(request, "queues.html", who, rows=...)

A request without a valid session cookie is sent to /login (htmx requests get an
`HX-Redirect`). Errors raised by a handler become the error page, or, for an htmx
request, a message swapped into the page's `#flash` area.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from argosy.core.errors import ArgosyError
from argosy.server.auth import Principal
from argosy.server.control import Control

COOKIE = "argosy_session"
TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
TEMPLATES.env.filters["utc"] = lambda t: (
    datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t is not None else ""
)
log = logging.getLogger("argosy.console")


class LoginRequiredError(Exception):
    """No session cookie, or one whose token the store does not know."""


class ConsoleError(Exception):
    """A user-facing error: shown as a message with its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def viewer(request: Request) -> Principal:
    token = request.cookies.get(COOKIE, "")
    who = request.app.state.tokens.principal(token) if token else None
    if who is None:
        raise LoginRequiredError
    return who


def control(request: Request) -> Control:
    return request.app.state.control


Viewer = Annotated[Principal, Depends(viewer)]
Ctl = Annotated[Control, Depends(control)]


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def render(
    request: Request, template: str, who: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    context |= {"who": who, "path": request.url.path}
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status)


def flash(request: Request, message: str, status: int, kind: str = "error") -> Response:
    """An error or notice: a fragment into #flash for htmx, else the error page."""
    if is_htmx(request):
        headers = {"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"}
        html = TEMPLATES.get_template("_flash.html").render(message=message, kind=kind)
        return HTMLResponse(html, headers=headers)  # 200: htmx swaps only 2xx answers
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
            except ConsoleError as err:
                return flash(request, str(err), err.status)
            except HTTPException as err:
                return flash(request, _detail(err.detail), err.status_code)
            except RequestValidationError as err:
                return flash(request, _detail(list(err.errors())), 422)
            except ArgosyError as err:
                return flash(request, str(err), 422)
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
