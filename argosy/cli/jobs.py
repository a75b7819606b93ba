"""Job commands over HTTP: submit, jobs, job, logs, cancel, queues, nodes, cordon,
repair, forget-node.

argosy submit job.yaml [--json]         # a service YAML goes to argosy.cli.services
argosy jobs [--state running] [--queue team-a] [--json]
argosy job JOB [--json]; argosy logs JOB [-f]; argosy cancel JOB
argosy queues; argosy nodes; argosy cordon NODE [--undo]; argosy forget-node NODE
(token commands: argosy.cli.tokens)

httpx is imported when a command calls the server.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from argosy.cli.client import Client, JsonOption, ServerOption, TokenFileOption, TokenOption
from argosy.cli.common import console, print_json
from argosy.core.errors import ArgosyError

TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(
    file: Path = typer.Argument(..., help="Job YAML."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Submit a job or service YAML to its queue.

    A `kind: service` or a `model` key marks a service."""
    from argosy.cli.services import submit_service
    from argosy.core.documents import load_yaml
    from argosy.server.service_spec import document_kind
    from argosy.server.spec import load_job_file

    if not file.exists():
        raise ArgosyError(f"job file '{file}' not found")
    if document_kind(load_yaml(file)) == "service":
        submit_service(file, Client(server, token, token_file), as_json)
        return
    spec = load_job_file(file, Path.cwd())
    key = str(uuid.uuid4())  # a retried request cannot submit twice
    body = spec.model_dump()
    job = Client(server, token, token_file).call(
        "POST", "/jobs", json=body, headers={"Idempotency-Key": key}
    )
    if as_json:
        print_json(job)
        return
    console.print(f"submitted {job['id']} ({job['name']}) to queue {job['queue']}")


def jobs(
    state: list[str] = typer.Option([], "--state", help="Filter by state (repeatable)."),
    queue: str | None = typer.Option(None, "--queue", help="Filter by queue."),
    limit: int = typer.Option(100, "--limit", min=1, max=500, help="Jobs per page."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """List jobs, oldest first."""
    params: dict = {"limit": limit, "state": state}
    if queue:
        params["queue"] = queue
    page = Client(server, token, token_file).call("GET", "/jobs", params=params)
    if as_json:
        print_json(page["items"])
        return
    table = Table("id", "name", "queue", "state", "attempts", "created")
    for j in page["items"]:
        table.add_row(
            j["id"], j["name"], j["queue"], j["state"], str(j["attempts"]), j["created_at"]
        )
    console.print(table)


def job(
    job_id: str = typer.Argument(..., help="Job id."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Show one job and its event log."""
    client = Client(server, token, token_file)
    data = client.call("GET", f"/jobs/{job_id}")
    if as_json:
        print_json(data)
        return
    console.print(
        f"[bold]{data['id']}[/] {escape(data['name'])} in {data['queue']}: {data['state']}",
        emoji=False,
    )
    console.print(f"attempts {data['attempts']}; created {data['created_at']}")
    elastic = data["spec"].get("elastic")
    if elastic:
        ranks = sum((data["placement"] or {}).get("nodes", {}).values())
        console.print(
            f"elastic: {elastic['min_nnodes']}..{elastic['max_nnodes']} node(s); "
            f"{ranks} device(s) now (resizes: events resize, resized)",
            highlight=False,
        )
    if data["reason"]:
        console.print(f"reason: {data['reason']}", highlight=False, markup=False, emoji=False)
    if data.get("waiting"):
        console.print(f"waiting: {data['waiting']}", highlight=False, markup=False, emoji=False)
    if data.get("error"):  # the whole line, for the job's queue and the admins
        console.print(f"error: {data['error']}", highlight=False, markup=False)
    account = (data.get("summary") or {}).get("job")
    if account:
        console.print(goodput_line(account), highlight=False, markup=False)
    for e in client.call("GET", f"/jobs/{job_id}/events")["items"]:
        by = f"  (by {e['actor']})" if e.get("actor", "system") != "system" else ""
        line = f"  {e['created_at']}  {e['kind']:<12} {e['message']}{by}"
        console.print(line, highlight=False, markup=False, emoji=False)


def goodput_line(account: dict) -> str:
    """One line of a job's goodput over its attempts (`summary.job`)."""
    lost = ", ".join(
        f"{cause} {seconds:.1f} s" for cause, seconds in account["lost_s"].items() if seconds
    )
    return (
        f"effective training time {account['effective_training_time']:.1%} over "
        f"{account['attempts']} attempt(s): wall {account['wall_s']:.1f} s, productive "
        f"{account['productive_s']:.1f} s, {account['restarts']} restart(s), "
        f"{account['faults']} fault(s)" + (f"; lost: {lost}" if lost else "") + _estimated(account)
    )


def _estimated(account: dict) -> str:
    """Which attempts' productive time is an estimate (no summary, no event log)."""
    numbers = account.get("estimated") or []
    if not numbers:
        return ""
    which = ", ".join(str(n) for n in numbers)
    return (
        f"; attempt {which} left neither a summary nor its event log: its productive time is "
        "estimated, the steps a later attempt resumed past where it began (none while no "
        "later attempt has resumed)"
    )


def logs(
    job_id: str = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until it ends."),
    rank: str = typer.Option(
        "0", "--rank", help="Rank whose output to show, or `launcher` (why an attempt failed)."
    ),
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Print the output of a job's latest attempt."""
    if rank != "launcher" and not rank.isdigit():
        raise typer.BadParameter(
            f"'{rank}' is neither a rank number nor 'launcher'", param_hint="--rank"
        )
    client, offset, file = Client(server, token, token_file), 0, None
    while True:
        params = {"offset": offset, "rank": rank} | ({"file": file} if file is not None else {})
        r = client.raw("GET", f"/jobs/{job_id}/logs", params=params)
        if r.text:
            typer.echo(r.text, nl=False)
        offset = int(r.headers.get("x-next-offset", offset))
        file = r.headers.get("x-log-file", file)  # a newer attempt's log: from its start
        if not follow or (not r.text and _ended(client, job_id)):
            return
        if not r.text:
            time.sleep(0.5)


def _ended(client: Client, job_id: str) -> bool:
    return client.call("GET", f"/jobs/{job_id}")["state"] in TERMINAL


def cancel(
    job_id: str = typer.Argument(..., help="Job id."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Cancel a job (a running one stops its attempt first)."""
    data = Client(server, token, token_file).call("POST", f"/jobs/{job_id}/cancel")
    if as_json:
        print_json(data)
        return
    if data["state"] in ("admitted", "running"):  # its attempt stops first
        data = {**data, "state": "stopping (cancelled once its attempt has stopped)"}
    console.print(f"{data['id']}: {data['state']}")


def queues(
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Show the queue tree: quota, use, pending and running jobs."""
    data = Client(server, token, token_file).call("GET", "/queues")
    if as_json:
        print_json(data)
        return
    table = Table("queue", "parent", "nominal", "usage", "pending", "running")
    for q in data:
        table.add_row(
            q["name"],
            q["parent"] or "",
            _chips(q["nominal"]),
            _chips(q["usage"]),
            str(q["pending"]),
            str(q["running"]),
        )
    console.print(table)


def nodes(
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Show the executor's nodes and what runs on them."""
    data = Client(server, token, token_file).call("GET", "/nodes")
    if as_json:
        print_json(data)
        return
    table = Table("node", "chip", "devices", "free", "state", "jobs")
    for n in data:
        table.add_row(
            n["name"],
            n["chip"],
            str(n["devices"]),
            str(n["free"]),
            node_state(n),
            ", ".join(n["jobs"]),
        )
    console.print(table)


def node_state(n: dict) -> str:
    """Why a node takes no new work, in words ("" when it takes it): lost, cordoned by an
    operator, or kept out by its health record (`argosy repair NODE` clears it)."""
    why = [f"[red]lost[/]{_since(n.get('lost_at'))}"] if not n.get("up", True) else []
    why += ["cordoned"] if n.get("cordoned") else []
    health = n.get("health", "healthy")
    why += [f"health: {health}"] if health not in ("healthy", "repaired") else []
    return ", ".join(why)


def _since(stamp: object) -> str:
    """ " since <local time>" of a Unix time the server gave, "" without one."""
    if not isinstance(stamp, int | float) or isinstance(stamp, bool):
        return ""
    try:
        return time.strftime(" since %Y-%m-%d %H:%M", time.localtime(stamp))
    except (OverflowError, OSError, ValueError):
        return ""


def cordon(
    node: str = typer.Argument(..., help="Node name (see argosy nodes)."),
    undo: bool = typer.Option(False, "--undo", help="Uncordon."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Keep new work off a node (admin token); what runs there keeps running."""
    verb = "uncordon" if undo else "cordon"
    data = Client(server, token, token_file).call("POST", f"/nodes/{node}/{verb}")
    if as_json:
        print_json(data)
        return
    state = node_state(data)
    console.print(f"{data['name']}: {state or 'schedulable'}")


def forget_node(
    node: str = typer.Argument(..., help="Node name (see argosy nodes)."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Forget a lost node for good (admin token).

    It leaves `argosy nodes` and the cluster's capacity; refused while it is up or holds
    work. It joins as new if it comes back."""
    data = Client(server, token, token_file).call("DELETE", f"/nodes/{node}")
    if as_json:
        print_json(data)
        return
    console.print(f"{data['name']}: forgotten ({data['devices']} {data['chip']})")


def repair(
    node: str = typer.Argument(..., help="Node name (see argosy nodes)."),
    detail: str = typer.Option("repaired", "--detail", help="What was done (kept in its record)."),
    as_json: bool = JsonOption,
    server: str | None = ServerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Report a node repaired (admin token).

    A node its health record cordoned or quarantined returns to service, on probation."""
    body = {"verdict": "repair", "detail": detail}
    data = Client(server, token, token_file).call("POST", f"/nodes/{node}/health", json=body)
    if as_json:
        print_json(data)
        return
    console.print(f"{data['name']}: {node_state(data) or 'schedulable'}")


def _chips(values: dict[str, int]) -> str:
    return ", ".join(f"{c}: {n}" for c, n in values.items())
