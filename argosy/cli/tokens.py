"""Token commands over HTTP (admin token): create, list, revoke.

argosy token create --queue team-a [--name ci] [--expires 30d]   # the token, once
argosy token list [--json]
argosy token revoke t1a2b3c4d5e6f

`create` prints the token alone on stdout (for `TOKEN=$(argosy token create ...)`) and
its id and expiry on stderr. httpx is imported when a command calls the server.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import typer
from rich.table import Column, Table

from argosy.cli.client import Client, JsonOption, ServerOption, TokenFileOption, TokenOption
from argosy.cli.common import console, err_console, print_json, usage_error

EXPIRES = re.compile(r"[1-9][0-9]{0,8}[smhdw]")

app = typer.Typer(help="API tokens: create, list, revoke (admin token).", no_args_is_help=True)


@app.command("create")
def create(
    queue: str | None = typer.Option(None, "--queue", help="Scope to one queue; none: admin."),
    name: str = typer.Option("", "--name", help="Label (events name the token by id and it)."),
    expires: str | None = typer.Option(
        None, "--expires", help="Lifetime: a number and s, m, h, d or w (30d); none: never."
    ),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Create a token; it is printed once (only a salted hash is kept)."""
    if expires is not None and re.fullmatch(r"0+[smhdw]", expires):
        raise usage_error(f"--expires '{expires}': the lifetime must be more than 0 (e.g. 30d)")
    if expires is not None and not EXPIRES.fullmatch(expires):
        raise usage_error(f"--expires '{expires}': give a number and s, m, h, d or w (e.g. 30d)")
    body: dict = {"queue": queue, "name": name}
    if expires is not None:
        body["expires"] = expires
    data = Client(server, token, token_file).call("POST", "/tokens", json=body)
    if as_json:
        print_json(data)
        return
    typer.echo(data["token"])
    scope = f"queue {data['queue']}" if data["queue"] else "admin"
    until = f"expires {data['expires_at']}" if data["expires_at"] else "never expires"
    err_console.print(f"token {data['id']} ({scope}); {until}", highlight=False)


@app.command("list")
def list_tokens(
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """List tokens (never a secret).

    Id, name, queue, state, when created and when it ends (expiry or revocation); --json
    adds exact times and who created each."""
    data = Client(server, token, token_file).call("GET", "/tokens")
    if as_json:
        print_json(data)
        return
    table = Table(
        Column("id", no_wrap=True, min_width=13),  # never cut: `revoke` takes it
        "name",
        "queue",
        "state",
        Column("created", no_wrap=True, min_width=10),
        Column("ends (UTC)", no_wrap=True, min_width=16),
    )
    for t in data:
        when = t["revoked_at"] if t["state"] == "revoked" else t["expires_at"]
        table.add_row(
            t["id"],
            t["name"],
            t["queue"] or "(admin)",
            t["state"],
            t["created_at"][:10],
            _minute(when) if when else "never",
        )
    console.print(table)


def _minute(iso: str) -> str:
    """`2025-06-01T12:00:00.000Z` as `2025-06-01 12:00` (UTC)."""
    return iso[:16].replace("T", " ")


@app.command("revoke")
def revoke(
    token_id: str = typer.Argument(..., help="Token id (see argosy token list)."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Revoke a token at once; its console sessions end too."""
    data = Client(server, token, token_file).call("DELETE", f"/tokens/{quote(token_id, safe='')}")
    if as_json:
        print_json(data)
        return
    label = f" ({data['name']})" if data.get("name") else ""
    console.print(f"revoked {data['id']}{label}", highlight=False, markup=False)
