"""The web console: server-rendered pages (Jinja2 + htmx + uPlot, all served from this
package, no CDN) on top of the same control plane and tokens as the REST API.

    app = create_app(config)
    mount_console(app)          # /, /login, /jobs, /queues, /nodes, /services, /sim, /static

A person logs in at /login with an API token; the server opens a session
(`argosy.server.sessions`) and the HttpOnly, SameSite=Strict cookie holds only the
session's id, never the token. Every form sends the session's CSRF token back.
UPLOAD_CAPS tells the body cap (`argosy.server.guards`) which console forms may be
larger than `max_body_bytes`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from argosy.server.console.simreports import MAX_REPORT_BYTES

STATIC_DIR = Path(__file__).parent / "static"
MULTIPART_SLACK_BYTES = 64 << 10
"""Room for a multipart form's boundaries, part headers and other fields."""
UPLOAD_CAPS = {("POST", "/sim"): (MAX_REPORT_BYTES + MULTIPART_SLACK_BYTES, "sim report upload")}
"""(method, path) -> (body cap in bytes, its name in the 413 message)."""

__all__ = ["STATIC_DIR", "UPLOAD_CAPS", "mount_console"]


def mount_console(app: FastAPI) -> None:
    """Add the console's routes and its static files to `app`."""
    from argosy.server.console.routes import router

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
