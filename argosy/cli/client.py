"""The HTTP client the job commands share: server address, token, errors as one line.

The server comes from `--server`, then `ARGOSY_SERVER`, then http://127.0.0.1:8275; the
token from `--token-file PATH` (or `--token`, which warns: a command line is visible to
every user of the host), then `ARGOSY_TOKEN`, then the file `ARGOSY_TOKEN_FILE` names, then
`$ARGOSY_HOME/admin.token`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from argosy.core.errors import ArgosyError
from argosy.core.net import DEFAULT_PORT

DEFAULT_SERVER = f"http://127.0.0.1:{DEFAULT_PORT}"

ServerOption = typer.Option(None, "--server", help="Server URL (env ARGOSY_SERVER).")
TOKEN_WARNING = (
    "warning: a token given with --token is on this command line, which every user of"
    " this host (jobs included) can read in /proc; prefer ARGOSY_TOKEN or --token-file"
)


def _token_flag(value: str | None) -> str | None:
    """The token of `--token T`, with a warning: command lines are visible to other users."""
    if value is not None:
        typer.echo(TOKEN_WARNING, err=True)
    return value


def read_token_file(path: Path) -> str:
    """The token in `path` (its first line, stripped); `ArgosyError` when it cannot be
    read or is empty."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ArgosyError(f"cannot read the token file '{path}': {err.strerror or err}") from err
    token = (text.strip().splitlines() or [""])[0].strip()
    if not token:
        raise ArgosyError(f"the token file '{path}' is empty")
    return token


TokenOption = typer.Option(
    None,
    "--token",
    callback=_token_flag,
    help=(
        "API token (visible to every user in the process list: prefer env ARGOSY_TOKEN"
        " or --token-file)."
    ),
)
TokenFileOption = typer.Option(
    None,
    "--token-file",
    help="A file holding the API token (env ARGOSY_TOKEN_FILE); kept off the command line.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON.")


class Client:
    """Calls /api/v1 of one server with one token; over plain HTTP, only over connections
    whose server end root, this user or the argosy server's user owns (`owner_checked`)."""

    def __init__(
        self, server: str | None, token: str | None, token_file: Path | None = None
    ) -> None:
        self.base = (server or os.environ.get("ARGOSY_SERVER") or DEFAULT_SERVER).rstrip("/")
        self.token = (
            token
            or (read_token_file(token_file) if token_file else None)
            or os.environ.get("ARGOSY_TOKEN")
            or _env_token_file()
            or _admin_token()
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.raw(method, path, **kwargs)
        return response.json()

    def raw(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        from argosy.cli.owner_checked import owner_checked

        headers = kwargs.pop("headers", {})
        transport = None
        if self.token:  # over a connection whose server end no stranger owns
            headers["Authorization"] = f"Bearer {self.token}"
            scheme = self.base.split("://", 1)[0].lower() if "://" in self.base else ""
            if scheme not in ("http", "https"):
                raise ArgosyError(f"bad server URL '{self.base}': give http:// or https://")
            transport = owner_checked(trusted_uids()) if scheme == "http" else None
        try:
            with httpx.Client(transport=transport, timeout=30.0) as http:
                url = f"{self.base}/api/v1{path}"
                response = http.request(method, url, headers=headers, **kwargs)
        except httpx.InvalidURL as err:
            raise ArgosyError(f"bad server URL '{self.base}': {err}") from err
        except httpx.HTTPError as err:
            raise ArgosyError(f"cannot reach the argosy server at {self.base}: {err}") from err
        if response.status_code >= 400:
            raise ArgosyError(f"{response.status_code}: {_detail(response)}")
        return response


def trusted_uids() -> set[int]:
    """Whose process may receive the token: root, this user and the owner of the home's
    admin token (the server's user); a port of this host held by anyone else (a job that
    took the server's port) gets no token (`owner_checked`)."""
    return {0, os.geteuid(), *_admin_token_owner()}


def _admin_token_owner() -> set[int]:
    """The owner of the home's `admin.token` (the server's user), when there is one."""
    from argosy.core.home import default_home

    try:
        return {(default_home() / "admin.token").stat().st_uid}
    except OSError:
        return set()


def _env_token_file() -> str | None:
    """The token in the file `ARGOSY_TOKEN_FILE` names, when it is set."""
    path = os.environ.get("ARGOSY_TOKEN_FILE")
    return read_token_file(Path(path)) if path else None


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
