"""Store rows -> API models (times as ISO 8601 UTC)."""

from __future__ import annotations

from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii as _quote  # C: a JSON string
from pathlib import Path

from argosy.core.confined import list_confined, read_job_file, stat_job_file
from argosy.executors.local import attempt_dir
from argosy.server.failures import ERROR_LINE_CHARS, ERROR_TAIL_BYTES, public_line, telling
from argosy.server.scheduling import Scheduling
from argosy.server.schemas import Event, Job, NodeView, Placement, QueueInfo, Replica, Service
from argosy.server.service_spec import ServiceSpec
from argosy.server.spec import ElasticSpec, JobSpec
from argosy.server.store import Row

LAUNCHER_OUTPUT = "output.log"
"""The launcher's stdout and stderr in its attempt directory (`attempt_dir`)."""


def latest_rank_log(run_dir: Path, rank: int) -> Path | None:
    """The log of `rank` in the newest attempt (attempt10 after 9) under `run_dir/logs`
    and under each `run_dir/node<i>/logs` (node rank i of a multi-node attempt keeps its
    ranks' logs in its own run directory): of those, the one written last. The job made
    those directories: they are listed without following links, as the log is then
    read (`list_confined`)."""
    found = []
    for base in ["logs", *(f"{n}/logs" for n in list_confined(run_dir) if _is_node_dir(n))]:
        path = _newest_rank_log(run_dir, base, f"rank{rank}.log")
        info = stat_job_file(path) if path is not None else None
        if info is not None:
            found.append((info.st_mtime_ns, path))
    return max(found)[1] if found else None


def _newest_rank_log(run_dir: Path, base: str, log: str) -> Path | None:
    numbered = [
        (number, name)
        for name in list_confined(run_dir, base)
        if (number := _attempt_number(name)) is not None
    ]
    for _, name in sorted(numbered, reverse=True):
        if log in list_confined(run_dir, f"{base}/{name}"):
            return run_dir / base / name / log
    return None


def _is_node_dir(name: str) -> bool:
    digits = name.removeprefix("node")
    return name != digits and digits.isdigit()


def log_name(run_dir: Path, path: Path | None) -> str:
    """Which log file `path` is: its place and its inode, so a follower sees a newer
    attempt's log take over (each launcher moves the previous run's logs to `history/`
    and starts its `logs/attempt0` again: a new file) and nothing else does (the server's
    attempt counter moves at admission, before the new launcher has moved the old log);
    "" without a log."""
    info = stat_job_file(path) if path is not None else None
    return "" if path is None or info is None else f"{path.relative_to(run_dir)}@{info.st_ino}"


def _attempt_number(name: str) -> int | None:
    digits = name.removeprefix("attempt")
    return int(digits) if name != digits and digits.isdigit() else None


def read_log_chunk(path: Path | None, offset: int, limit: int) -> bytes:
    """At most `limit` bytes of the log at `path` from byte `offset` (none when no log).
    A job writes its logs: they are read without following links (`read_job_file`), so
    a log that is a link to a server secret reads as no log."""
    if path is None:
        return b""
    return read_job_file(path, limit=limit, offset=offset) or b""


def launcher_log(run_dir: Path, attempt: int) -> Path | None:
    """The launcher's own output (stdout and stderr, as the executor keeps it) of attempt
    `attempt`: the local wrapper's `output.log`, else node rank 0's log of a Ray attempt;
    None before the first attempt."""
    if attempt <= 0:
        return None
    where = attempt_dir(run_dir, attempt)
    local = where / LAUNCHER_OUTPUT
    ray = where / "node0.log"
    return ray if not local.exists() and ray.exists() else local


def launcher_error(run_dir: Path, attempt: int) -> str:
    """The line of the launcher's output that says why attempt `attempt` failed (the
    exception of a traceback, an `error:` line, an OS error), from the last
    `ERROR_TAIL_BYTES` of it and at most `ERROR_LINE_CHARS` long; "" when none does."""
    return launcher_telling(run_dir, attempt)[0]


def public_launcher_error(run_dir: Path, attempt: int) -> str:
    """`launcher_error` as every token may read it (`failures.public_line`)."""
    return public_line(*launcher_telling(run_dir, attempt))


def launcher_telling(run_dir: Path, attempt: int) -> tuple[str, bool]:
    """`launcher_error`, and whether it quotes a rank's output (`failures.telling`)."""
    path = launcher_log(run_dir, attempt)
    info = stat_job_file(path) if path is not None else None  # no links followed
    if info is None:
        return "", False
    tail = read_log_chunk(path, max(0, info.st_size - ERROR_TAIL_BYTES), ERROR_TAIL_BYTES)
    line, quoted = telling(tail.decode(errors="replace"))
    line = line if len(line) <= ERROR_LINE_CHARS else line[: ERROR_LINE_CHARS - 3] + "..."
    return line, quoted


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_view(row: Row) -> Job:
    """Rows come from our own store, validated when they went in: constructed without a
    second validation (a page of 100 jobs is the API's most expensive answer)."""
    placement = row["placement"]
    return Job.model_construct(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        state=row["state"],
        attempts=row["attempts"],
        created_at=iso(row["created_at"]) or "",
        started_at=iso(row["started_at"]),
        finished_at=iso(row["finished_at"]),
        reason=row["reason"] or "",
        exit_code=row["exit_code"],
        placement=Placement.model_construct(**placement) if placement else None,
        spec=_spec(row["spec"]),
        summary=row["summary"],
    )


def _spec(values: Row) -> JobSpec:
    elastic = values.get("elastic")
    if elastic is None:
        return JobSpec.model_construct(**values)
    return JobSpec.model_construct(**(values | {"elastic": ElasticSpec.model_construct(**elastic)}))


def job_json(row: Row) -> str:
    """The job as `job_view(...).model_dump_json()` writes it, from a row whose JSON
    columns are still text (`list_jobs(raw_json=True)`): a page of 100 jobs is built
    without decoding and encoding every spec again."""
    exit_code = row["exit_code"]
    return (
        f'{{"id":{_quote(row["id"])},"name":{_quote(row["name"])},'
        f'"queue":{_quote(row["queue"])},"state":{_quote(row["state"])},'
        f'"attempts":{int(row["attempts"])},"created_at":{_quote(iso(row["created_at"]) or "")},'
        f'"started_at":{_text(iso(row["started_at"]))},'
        f'"finished_at":{_text(iso(row["finished_at"]))},"reason":{_quote(row["reason"] or "")},'
        f'"exit_code":{"null" if exit_code is None else int(exit_code)},'
        f'"placement":{row["placement"] or "null"},"spec":{row["spec"]},'
        f'"summary":{row["summary"] or "null"},"error":null,"waiting":null}}'
    )


def _text(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def event_view(row: Row) -> Event:
    return Event(
        seq=row["seq"],
        job_id=row["job_id"],
        kind=row["kind"],
        message=row["message"],
        created_at=iso(row["created_at"]) or "",
        actor=row.get("actor") or "system",
    )


def queue_views(s: Scheduling, counts: dict[tuple[str, str], int]) -> list[QueueInfo]:
    tree = s.sched.tree
    out = []
    for i, name in enumerate(tree.names):
        parent = tree.parents[i]

        def per_chip(table, i=i) -> dict[str, int]:  # noqa: ANN001
            return {c: int(table[i, j]) for j, c in enumerate(tree.chips)}

        out.append(
            QueueInfo(
                name=name,
                parent=tree.names[parent] if parent >= 0 else None,
                leaf=name in tree.leaves,
                weight=float(tree.weights[i]),
                guarantee=per_chip(tree.guarantee),
                nominal=per_chip(tree.nominal),
                ceiling=per_chip(tree.ceiling),
                usage=per_chip(tree.usage),
                pending=counts.get((name, "pending"), 0),
                running=counts.get((name, "running"), 0) + counts.get((name, "admitted"), 0),
            )
        )
    return out


def node_views(
    s: Scheduling,
    cordoned: set[str],
    lost: set[str],
    health: dict[str, str] | None = None,
    lost_at: dict[str, float] | None = None,
) -> list[NodeView]:
    out = []
    for n in s.nodes:
        used = s.used_on(n.name)
        out.append(
            NodeView(
                name=n.name,
                chip=n.chip,
                devices=n.devices,
                free=0 if n.name in s.out_of_service else n.devices - used,
                used=used,
                cordoned=n.name in cordoned,
                up=n.name not in lost,
                lost_at=(lost_at or {}).get(n.name) if n.name in lost else None,
                jobs=s.jobs_on(n.name),
                health=(health or {}).get(n.name, "healthy"),
            )
        )
    return out


PUBLISHED = frozenset({"ready", "yielding", "asleep", "waking"})
"""Replica states whose URL a service shows: the replica proved it holds its port (a
starting replica's port is not shown, so no other tenant learns it to take it first)."""


def service_view(row: Row) -> Service:
    replicas = []
    for r in row["replicas"]:
        shown = r.get("port") and r.get("state") in PUBLISHED
        url = f"http://{r['address']}:{r['port']}/v1" if shown else None
        replicas.append(
            Replica(
                index=r["index"],
                node=r.get("node"),
                state=r.get("state", "pending"),
                url=url,
                attempt=r.get("attempt", 0),
                restarts=r.get("restarts", 0),
                failed_probes=r.get("failed_probes", 0),
            )
        )
    return Service(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        state=row["state"],
        created_at=iso(row["created_at"]) or "",
        reason=row["reason"] or "",
        replicas=replicas,
        endpoints=[r.url for r in replicas if r.state == "ready" and r.url],
        spec=ServiceSpec.model_validate(row["spec"]),
    )
