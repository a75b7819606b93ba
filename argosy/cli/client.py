"""The HTTP client the job commands share: server address, token, errors as one line.

The server comes from `--server`, then `ARGOSY_SERVER`, then http://127.0.0.1:8275; the
token from `--token`, then `ARGOSY_TOKEN`, then `$ARGOSY_HOME/admin.token`.
"""

from __future__ import annotations

import os
from typing import Any

import typer

from argosy.core.errors import ArgosyError
from argosy.core.net import DEFAULT_PORT

DEFAULT_SERVER = f"http://127.0.0.1:{DEFAULT_PORT}"

ServerOption = typer.Option(None, "--server", help="Server URL (env ARGOSY_SERVER).")
TokenOption = typer.Option(None, "--token", help="API token (env ARGOSY_TOKEN).")
JsonOption = typer.Option(False, "--json", help="Print JSON.")


class Client:
    """Calls /api/v1 of one server with one token."""

    def __init__(self, server: str | None, token: str | None) -> None:
        self.base = (server or os.environ.get("ARGOSY_SERVER") or DEFAULT_SERVER).rstrip("/")
        self.token = token or os.environ.get("ARGOSY_TOKEN") or _admin_token()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.raw(method, path, **kwargs)
        return response.json()

    def raw(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        headers = kwargs.pop("headers", {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = httpx.request(
                method, f"{self.base}/api/v1{path}", headers=headers, timeout=30.0, **kwargs
            )
        except httpx.HTTPError as err:
            raise ArgosyError(f"cannot reach the argosy server at {self.base}: {err}") from err
        if response.status_code >= 400:
            raise ArgosyError(f"{response.status_code}: {_detail(response)}")
        return response


def _admin_token() -> str | None:
    from argosy.core.home import default_home

    home = default_home()
    try:
        return (home / "admin.token").read_text().strip()
    except OSError:
        return None


def _detail(response: Any) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:200]
    if isinstance(detail, list):  # field errors: every 422's shape
        return "; ".join(_field_error(e) for e in detail if isinstance(e, dict))
    return str(detail)


def _field_error(e: dict) -> str:
    """One field error in words: `field 'queue': ...`, or the message alone for the body."""
    field = ".".join(str(p) for p in (e.get("loc") or [])[1:])
    return f"field '{field}': {e.get('msg')}" if field else str(e.get("msg"))
