"""Helpers of the console tests: paths, logging in through the form (a browser's, or an
HTTP client's), screenshots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCREENS = ROOT / "runs" / "console-screens"


def login(pg, url: str, token: str) -> None:  # noqa: ANN001
    pg.goto(url + "/login")
    pg.fill("input[name=token]", token)
    pg.click("button[type=submit]")
    pg.wait_for_selector("nav")


def csrf_of(html: str) -> str:
    """The session's CSRF token as a page's forms carry it."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def login_client(client: Any, token: str) -> str:
    """Log an HTTP client (TestClient or httpx.Client) in through POST /login, as a
    browser does; returns the session's CSRF token, read from a page's form."""
    client.cookies.clear()
    r = client.post("/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text[:300]
    return csrf_of(client.get("/submit").text)


def shot(pg, name: str) -> Path:  # noqa: ANN001
    SCREENS.mkdir(parents=True, exist_ok=True)
    path = SCREENS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    return path


class OtherSite:
    """Pages served from another origin (a port of its own on 127.0.0.1, reachable as
    127.0.0.1 or as localhost): what a hostile page on the same machine can do.

        with OtherSite({"/attack.html": "<form ...>"}) as site:
            pg.goto(site.url("localhost", "/attack.html"))
    """

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages

    def __enter__(self) -> OtherSite:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = pages.get(self.path, "not here").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"
