"""The web console: server-rendered pages (Jinja2 + htmx + uPlot, all served from this
package, no CDN) on top of the same control plane and tokens as the REST API.

    app = create_app(config)
    mount_console(app)          # /, /login, /jobs, /queues, /nodes, /services, /sim, /static

A person logs in at /login with an API token; the token is kept in an HttpOnly,
SameSite=Strict cookie and checked on every request exactly as a bearer token is.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"

__all__ = ["STATIC_DIR", "mount_console"]


def mount_console(app: FastAPI) -> None:
    """Add the console's routes and its static files to `app`."""
    from argosy.server.console.routes import router

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
