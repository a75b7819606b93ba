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
