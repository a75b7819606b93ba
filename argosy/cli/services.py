"""Service commands over HTTP: list services, show or delete one; `argosy submit` sends a
service YAML here (a `kind: service` or a `model` key marks one).

argosy submit service.yaml            # -> created s3f9a0c1b2d4e (chat) in queue default
argosy services [--state running] [--json]
argosy service SERVICE [--json]; argosy service SERVICE --delete

httpx is imported when a command calls the server.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from argosy.cli.client import Client, JsonOption, ServerOption, TokenFileOption, TokenOption
from argosy.cli.common import console, print_json


def submit_service(path: Path, client: Client, as_json: bool) -> None:
    """Validate a service YAML (file, line and field on a mistake) and create it."""
    from argosy.core.documents import load_yaml, validate
    from argosy.server.service_spec import ServiceSpec

    spec = validate(ServiceSpec, load_yaml(path))
    data = client.call("POST", "/services", json=spec.model_dump())
    if as_json:
        print_json(data)
        return
    console.print(f"created {data['id']} ({data['name']}) in queue {data['queue']}")


def services(
    state: list[str] = typer.Option([], "--state", help="Filter by state (repeatable)."),
    queue: str | None = typer.Option(None, "--queue", help="Filter by queue."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """List services, oldest first."""
    params: dict = {"state": state, "limit": 500}
    if queue:
        params["queue"] = queue
    page = Client(server, token, token_file).call("GET", "/services", params=params)
    if as_json:
        print_json(page["items"])
        return
    table = Table("id", "name", "queue", "model", "state", "ready", "endpoints")
    for s in page["items"]:
        table.add_row(
            s["id"],
            s["name"],
            s["queue"],
            s["spec"]["model"],
            s["state"],
            f"{len(s['endpoints'])}/{s['spec']['replicas']}",
            " ".join(s["endpoints"]),
        )
    console.print(table)


def service(
    service_id: str = typer.Argument(..., help="Service id."),
    delete: bool = typer.Option(False, "--delete", help="Stop its replicas and delete it."),
    key: bool = typer.Option(
        False, "--key", help="Print its API key (its queue and admins): 'Bearer' on /v1/*."
    ),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Show one service: replicas, endpoints and its event log (or delete it)."""
    client = Client(server, token, token_file)
    if key:
        print(client.call("GET", f"/services/{service_id}/key")["api_key"])
        return
    if delete:
        data = client.call("DELETE", f"/services/{service_id}")
    else:
        data = client.call("GET", f"/services/{service_id}")
    if as_json:
        print_json(data)
        return
    spec = data["spec"]
    console.print(
        f"[bold]{data['id']}[/] {escape(data['name'])} in {data['queue']}: {data['state']}",
        emoji=False,
    )
    console.print(
        f"model {spec['model']} ({spec['engine']}), {spec['replicas']} replica(s)",
        markup=False,
        emoji=False,
    )
    if spec.get("tidal"):
        t = spec["tidal"]
        awake = sum(r["state"] == "ready" for r in data["replicas"])
        console.print(
            f"tidal: {len(t['levels'])} levels over {t['period_s']:g} s, awake {t['lead_s']:g} s"
            f" before a rise, at least {t['min_replicas']}; {awake} awake now",
            highlight=False,
        )
    if data["reason"]:
        console.print(f"reason: {data['reason']}", highlight=False, markup=False, emoji=False)
    table = Table("replica", "node", "state", "url", "attempt", "restarts")
    for r in data["replicas"]:
        table.add_row(
            str(r["index"]),
            r["node"] or "",
            r["state"],
            r["url"] or "",
            str(r["attempt"]),
            str(r["restarts"]),
        )
    console.print(table)
    if delete:
        return
    for e in client.call("GET", f"/services/{service_id}/events")["items"]:
        line = f"  {e['created_at']}  {e['kind']:<16} {e['message']}"
        console.print(line, highlight=False, markup=False, emoji=False)
