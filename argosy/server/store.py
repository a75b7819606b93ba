"""The durable store: jobs, their event log, API tokens and node cordons, over SQLAlchemy.

Any SQLAlchemy URL works (SQLite by default, PostgreSQL in production); the schema is
brought to the newest version by alembic when the store opens. Every change of a job
and the event that explains it are written in one transaction, so the log never
disagrees with the state. Every event names its actor: the `actor=` of the write
(`admin`, `token <id> (<name>)`), else `system` (the control loop's own). Tokens are
stored as `argosy.server.auth` hashes them; the store never sees a secret.

    store = Store("sqlite:///state.db")
    row = store.insert_job(spec.model_dump(), now=time.time())
    store.update_job(row["id"], {"state": "running"}, event=("started", "attempt 1"))
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Text, cast, create_engine, event, func, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import Table

from argosy.server.schemas import SERVICE_TERMINAL, TERMINAL
from argosy.server.tables import (
    events,
    jobs,
    node_evidence,
    node_health,
    nodes,
    services,
    sessions,
    tokens,
)

Row = dict[str, Any]
JSON_COLUMNS = frozenset({"spec", "placement", "summary"})
JOB_ETT = func.coalesce(
    jobs.c.summary[("job", "effective_training_time")].as_float(),
    jobs.c.summary["effective_training_time"].as_float(),
)
"""A job's effective training time: over all its attempts (`summary.job`, folded by
argosy.server.job_goodput) where the server has folded them, else its summary's."""
Event = tuple[str, str]  # (kind, message)
SYSTEM_ACTOR = "system"
"""The actor of the control loop's own events (no request caused them)."""


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest alembic revision."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA wal_autocheckpoint=0")  # a background thread checkpoints
    cursor.close()


JOB_INSERT_COLUMNS = (
    "id",
    "name",
    "queue",
    "state",
    "attempts",
    "spec",
    "created_at",
    "updated_at",
    "reason",
    "idempotency_key",
    "request_hash",
)
JOB_INSERT_SQL = (
    f"INSERT INTO jobs ({', '.join(JOB_INSERT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(JOB_INSERT_COLUMNS))})"
)
EVENT_INSERT_COLUMNS = ("job_id", "kind", "message", "created_at", "actor")
EVENT_INSERT_SQL = (
    f"INSERT INTO events ({', '.join(EVENT_INSERT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(EVENT_INSERT_COLUMNS))})"
)


class IdempotencyConflictError(Exception):
    """The Idempotency-Key was used before with a different request."""


class Store:
    """Reads and writes of the control plane's state."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(url)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        migrate(self.engine)
        self._stop = threading.Event()
        self._jobs_version = 0  # bumped by every write of jobs through this store
        self._counts: tuple[int, dict[tuple[str, str], int]] = (-1, {})
        if self.engine.dialect.name == "sqlite":
            threading.Thread(target=self._checkpoints, name="wal-checkpoint", daemon=True).start()

    def _checkpoints(self, every_s: float = 1.0) -> None:
        """Move the WAL into the database off the request path (a commit that has to
        checkpoint itself waits on fsync: the p99 of submit)."""
        while not self._stop.wait(every_s):
            with self.engine.connect() as c:
                c.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        self._stop.set()
        self.engine.dispose()

    # ---- jobs ------------------------------------------------------------------------
    def insert_job(
        self,
        spec: Row,
        *,
        now: float,
        idempotency_key: str | None = None,
        request_hash: str = "",
        actor: str = SYSTEM_ACTOR,
    ) -> tuple[Row, bool]:
        """Store a new pending job; returns (row, created). A repeated Idempotency-Key
        with the same request returns the first job and created=False."""
        job_id = "j" + secrets.token_hex(6)
        values = {
            "id": job_id,
            "name": spec["name"],
            "queue": spec["queue"],
            "state": "pending",
            "attempts": 0,
            "spec": spec,
            "created_at": now,
            "updated_at": now,
            "reason": "",
            "idempotency_key": idempotency_key,
            "request_hash": request_hash,
        }
        event = _event(job_id, ("submitted", "queued"), now, actor)
        self._jobs_version += 1
        try:
            if self.engine.dialect.name == "sqlite":
                seq = self._insert_job_sqlite(values, event)
            else:
                with self.engine.begin() as c:
                    result = c.execute(jobs.insert(), values)  # parameters apart: cached SQL
                    c.execute(events.insert(), event)
                seq = result.inserted_primary_key[0]
        except (IntegrityError, sqlite3.IntegrityError):
            if idempotency_key is None:
                raise
            first = self.job_by_key(idempotency_key)
            if first is None or first["request_hash"] != request_hash:
                raise IdempotencyConflictError(idempotency_key) from None
            return first, False
        blank = {"started_at": None, "finished_at": None, "exit_code": None, "placement": None}
        blank |= {"summary": None, "stop_requested": None}
        return {"seq": seq, **values, **blank}, True

    def _insert_job_sqlite(self, values: Row, event: Row) -> int:
        """The submit's two inserts on the driver itself: SQLAlchemy's per-statement work
        was a third of a submit's CPU. Same SQL, same JSON text, one transaction."""
        job = [values[k] for k in JOB_INSERT_COLUMNS]
        job[JOB_INSERT_COLUMNS.index("spec")] = json.dumps(values["spec"])
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(JOB_INSERT_SQL, job)
            seq = int(cursor.lastrowid or 0)
            cursor.execute(EVENT_INSERT_SQL, [event[k] for k in EVENT_INSERT_COLUMNS])
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        finally:
            connection.close()  # back to the pool
        return seq

    def job_by_key(self, key: str) -> Row | None:
        """The job first submitted with this (token-scoped) Idempotency-Key, if any."""
        with self.engine.connect() as c:
            row = c.execute(select(jobs).where(jobs.c.idempotency_key == key)).mappings().first()
        return dict(row) if row else None

    def get_job(self, job_id: str) -> Row | None:
        with self.engine.connect() as c:
            row = c.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        return dict(row) if row else None

    def list_jobs(
        self,
        *,
        states: Iterable[str] = (),
        queue: str | None = None,
        name: str | None = None,
        cursor: int = 0,
        limit: int = 100,
        raw_json: bool = False,
    ) -> tuple[list[Row], int | None]:
        """One page of jobs in submit order after `cursor`; the next cursor or None. With
        `raw_json` the JSON columns (spec, placement, summary) come as their JSON text,
        for a page written out without decoding and encoding them again."""
        columns = [cast(c, Text).label(c.name) if c.name in JSON_COLUMNS else c for c in jobs.c]
        query = select(*columns) if raw_json else select(jobs)
        query = query.where(jobs.c.seq > cursor).order_by(jobs.c.seq).limit(limit + 1)
        states = list(states)
        if len(states) == 1:  # an equality is compiled once; an IN list on every call
            query = query.where(jobs.c.state == states[0])
        elif states:
            query = query.where(jobs.c.state.in_(states))
        if queue:
            query = query.where(jobs.c.queue == queue)
        if name:
            query = query.where(jobs.c.name == name)
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query).mappings()]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1]["seq"] if more and rows else None)

    def jobs_in(self, states: Iterable[str]) -> list[Row]:
        """Every job in one of `states`, in submit order (for reconciliation)."""
        query = select(jobs).where(jobs.c.state.in_(list(states))).order_by(jobs.c.seq)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(query).mappings()]

    def holds_since(self, since_s: float) -> list[Row]:
        """Every time a job held devices after `since_s`: its id, queue and placement, the
        hold's `start` and `end` (None: held still). A hold runs from an `admitted` event
        to the next event that gave the devices back (`pending`, `attempt_lost`,
        `stopped`, or the job's end), so time spent queued again between attempts is not
        counted. From these the scheduler's decayed use is rebuilt at start."""
        kinds = (HOLD_STARTS, *HOLD_ENDS)
        query = (
            select(jobs.c.id, jobs.c.queue, jobs.c.placement, events.c.kind, events.c.created_at)
            .join(events, events.c.job_id == jobs.c.id)
            .where(
                jobs.c.started_at.is_not(None),
                or_(jobs.c.finished_at.is_(None), jobs.c.finished_at >= since_s),
                events.c.kind.in_(kinds),
            )
            .order_by(events.c.seq)
        )
        with self.engine.connect() as c:
            rows = list(c.execute(query).mappings())
        admitted: dict[str, Row] = {}  # job id -> the event that opened its hold
        holds = []
        for r in rows:
            if not r["placement"]:
                continue
            if r["kind"] == HOLD_STARTS:
                admitted.setdefault(r["id"], r)
            elif r["id"] in admitted:
                holds.append(_hold(admitted.pop(r["id"]), r["created_at"]))
        holds += [_hold(opened, None) for opened in admitted.values()]
        return [h for h in holds if h["end"] is None or h["end"] >= since_s]

    def update_job(
        self, job_id: str, values: Row, *, event: Event | None = None, actor: str = SYSTEM_ACTOR
    ) -> None:
        """Change a job and log why (and who asked), in one transaction."""
        now = time.time()
        self._jobs_version += 1
        with self.engine.begin() as c:
            c.execute(update(jobs).where(jobs.c.id == job_id).values(updated_at=now, **values))
            if event is not None:
                c.execute(events.insert(), _event(job_id, event, now, actor))

    def count_jobs(self) -> dict[tuple[str, str], int]:
        """Jobs per (queue, state); counted again only after a write (the server is the
        store's one writer), so reads between writes do not scan every job."""
        version, counts = self._counts
        if version == self._jobs_version:
            return dict(counts)
        version = self._jobs_version
        query = select(jobs.c.queue, jobs.c.state, func.count()).group_by(
            jobs.c.queue, jobs.c.state
        )
        with self.engine.connect() as c:
            counts = {(q, s): int(n) for q, s, n in c.execute(query)}
        self._counts = (version, counts)
        return dict(counts)

    def remove_ended(self, job_ids: list[str], service_ids: list[str]) -> list[str]:
        """Remove those of these jobs and services that have ended, with their events, in
        one transaction (what `argosy.server.retention` chose: an active one is never
        removed, nor are its events). The ids removed."""
        self._jobs_version += 1
        with self.engine.begin() as c:
            gone = _ended_ids(c, jobs, job_ids, TERMINAL)
            gone += _ended_ids(c, services, service_ids, SERVICE_TERMINAL)
            if gone:
                c.execute(jobs.delete().where(jobs.c.id.in_(gone)))
                c.execute(services.delete().where(services.c.id.in_(gone)))
                c.execute(events.delete().where(events.c.job_id.in_(gone)))
        return gone

    # ---- services --------------------------------------------------------------------
    def insert_service(self, spec: Row, *, now: float, actor: str = SYSTEM_ACTOR) -> Row:
        """Store a new pending service with its replicas not yet placed."""
        values = {
            "id": "s" + secrets.token_hex(6),
            "name": spec["name"],
            "queue": spec["queue"],
            "state": "pending",
            "spec": spec,
            "replicas": [],
            "created_at": now,
            "updated_at": now,
            "reason": "",
            "stop_requested": None,
        }
        with self.engine.begin() as c:
            result = c.execute(services.insert(), values)
            submitted = _event(values["id"], ("submitted", "service"), now, actor)
            c.execute(events.insert(), submitted)
        return {"seq": result.inserted_primary_key[0], **values}

    def get_service(self, service_id: str) -> Row | None:
        with self.engine.connect() as c:
            query = select(services).where(services.c.id == service_id)
            row = c.execute(query).mappings().first()
        return dict(row) if row else None

    def list_services(
        self,
        *,
        states: Iterable[str] = (),
        queue: str | None = None,
        cursor: int = 0,
        limit: int = 100,
    ) -> tuple[list[Row], int | None]:
        """One page of services in submit order after `cursor`; the next cursor or None."""
        query = select(services).where(services.c.seq > cursor).order_by(services.c.seq)
        states = list(states)
        if states:
            query = query.where(services.c.state.in_(states))
        if queue:
            query = query.where(services.c.queue == queue)
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query.limit(limit + 1)).mappings()]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1]["seq"] if more and rows else None)

    def update_service(
        self,
        service_id: str,
        values: Row,
        *,
        event: Event | None = None,
        actor: str = SYSTEM_ACTOR,
    ) -> None:
        """Change a service and log why (and who asked), in one transaction."""
        now = time.time()
        with self.engine.begin() as c:
            query = update(services).where(services.c.id == service_id)
            c.execute(query.values(updated_at=now, **values))
            if event is not None:
                c.execute(events.insert(), _event(service_id, event, now, actor))

    def mean_effective_training_time(self) -> float | None:
        """Mean effective training time in the summaries of finished jobs, computed in
        SQL (a scrape never loads the finished jobs' rows)."""
        query = (
            select(func.avg(JOB_ETT))
            .where(jobs.c.state.in_(["succeeded", "failed"]))
            .where(JOB_ETT.is_not(None))
        )
        with self.engine.connect() as c:
            mean = c.execute(query).scalar()
        return None if mean is None else float(mean)

    # ---- events ----------------------------------------------------------------------
    def add_event(
        self, job_id: str | None, kind: str, message: str, *, actor: str = SYSTEM_ACTOR
    ) -> None:
        with self.engine.begin() as c:
            c.execute(events.insert(), _event(job_id, (kind, message), time.time(), actor))

    def last_actor(self, subject_id: str, kind: str) -> str:
        """Who caused the latest `kind` event of a job or service (e.g. the cancel that
        an attempt's stop completes); the system's if there is none."""
        query = (
            select(events.c.actor)
            .where(events.c.job_id == subject_id, events.c.kind == kind)
            .order_by(events.c.seq.desc())
            .limit(1)
        )
        with self.engine.connect() as c:
            return c.execute(query).scalar() or SYSTEM_ACTOR

    def count_events(self, job_id: str, kind: str) -> int:
        """Events of `kind` the job has had."""
        query = select(func.count()).where(events.c.job_id == job_id, events.c.kind == kind)
        with self.engine.connect() as c:
            return int(c.execute(query).scalar() or 0)

    def list_events(
        self, *, job_id: str | None = None, cursor: int = 0, limit: int = 100
    ) -> tuple[list[Row], int | None]:
        query = select(events).where(events.c.seq > cursor).order_by(events.c.seq)
        if job_id is not None:
            query = query.where(events.c.job_id == job_id)
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query.limit(limit + 1)).mappings()]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1]["seq"] if more and rows else None)

    # ---- tokens (argosy.server.auth hashes them; the store never sees a secret) ----------
    def add_token(
        self, values: Row, *, event: Event | None = None, actor: str = SYSTEM_ACTOR
    ) -> None:
        """Store a token row (id, hash, salt, queue, name, expires_at, created_by) and
        the event that explains it."""
        now = time.time()
        with self.engine.begin() as c:
            c.execute(tokens.insert().values(created_at=now, **values))
            if event is not None:
                c.execute(events.insert(), _event(None, event, now, actor))

    def token_by_id(self, token_id: str) -> Row | None:
        with self.engine.connect() as c:
            row = c.execute(select(tokens).where(tokens.c.id == token_id)).mappings().first()
        return dict(row) if row else None

    def update_token(self, token_id: str, values: Row, *, salt_was: str | None = None) -> bool:
        """Change a token's row (a new salt and hash, its creator); with `salt_was`, only
        if its salt is still that (two first uses of a legacy token re-hash it once)."""
        query = update(tokens).where(tokens.c.id == token_id)
        if salt_was is not None:
            query = query.where(tokens.c.salt == salt_was)
        with self.engine.begin() as c:
            return c.execute(query.values(**values)).rowcount > 0

    def list_tokens(self) -> list[Row]:
        """Every token, oldest first, without its hash and salt."""
        hidden = {"hash", "salt"}
        columns = [c for c in tokens.c if c.name not in hidden]
        query = select(*columns).order_by(tokens.c.created_at, tokens.c.id)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(query).mappings()]

    def revoke_token(self, token_id: str, *, now: float, event: Event, actor: str) -> None:
        """Mark a token revoked (once) and end its console sessions, in one transaction."""
        with self.engine.begin() as c:
            query = update(tokens).where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
            c.execute(query.values(revoked_at=now))
            c.execute(sessions.delete().where(sessions.c.token_id == token_id))
            c.execute(events.insert(), _event(None, event, now, actor))

    # ---- nodes -----------------------------------------------------------------------

    def cordoned(self) -> set[str]:
        with self.engine.connect() as c:
            return {r[0] for r in c.execute(select(nodes.c.name).where(nodes.c.cordoned))}

    def set_cordon(self, name: str, cordoned: bool, *, actor: str = SYSTEM_ACTOR) -> None:
        with self.engine.begin() as c:
            _put_node(c, name, cordoned=cordoned)
            kind = "cordoned" if cordoned else "uncordoned"
            event = _event(None, (kind, f"node {name}"), time.time(), actor)
            c.execute(events.insert().values(event))

    def known_nodes(self) -> list[Row]:
        """Every node the executor ever listed and nobody forgot: name, chip, devices,
        address and `lost_at` (wall seconds; None: not lost), by name."""
        query = select(nodes).where(nodes.c.chip.is_not(None)).order_by(nodes.c.name)
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(query)]

    def remember_nodes(self, listed: Iterable[tuple[str, str, int, str]]) -> None:
        """What the executor lists now: (name, chip, devices, address) of each node."""
        with self.engine.begin() as c:
            for name, chip, devices, address in listed:
                _put_node(c, name, chip=chip, devices=devices, address=address)

    def lost_since(self) -> dict[str, float]:
        """Each lost node's `lost_at`."""
        query = select(nodes.c.name, nodes.c.lost_at).where(nodes.c.lost_at.is_not(None))
        with self.engine.connect() as c:
            return {row.name: row.lost_at for row in c.execute(query)}

    def set_node_lost(self, name: str, lost_at: float | None) -> None:
        with self.engine.begin() as c:
            c.execute(update(nodes).where(nodes.c.name == name).values(lost_at=lost_at))

    def forget_node(self, name: str, *, actor: str = SYSTEM_ACTOR) -> None:
        """Drop a node from the inventory and its cordon; its health record stays (a
        node that comes back under the name is judged by its past)."""
        with self.engine.begin() as c:
            c.execute(nodes.delete().where(nodes.c.name == name))
            event = _event(None, ("node_forgotten", f"node {name}"), time.time(), actor)
            c.execute(events.insert().values(event))

    # ---- node health -----------------------------------------------------------------
    def health_records(self) -> dict[str, Row]:
        """Every node's stored policy record (`NodeRecord.to_json`)."""
        with self.engine.connect() as c:
            return {r.node: r.record for r in c.execute(select(node_health))}

    def save_health(
        self,
        node: str,
        record: Row,
        evidence: Row,
        event: Event | None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> None:
        """The node's new record, the evidence that made it, and (on a change of state)
        the event, in one transaction."""
        now = time.time()
        with self.engine.begin() as c:
            c.execute(node_health.delete().where(node_health.c.node == node))
            c.execute(node_health.insert().values(node=node, record=record, updated_at=now))
            c.execute(node_evidence.insert().values(node=node, created_at=now, **evidence))
            if event is not None:
                c.execute(events.insert().values(_event(None, event, now, actor)))

    def health_history(self, node: str, limit: int = 100) -> list[Row]:
        """The node's latest evidence, oldest first."""
        query = (
            select(node_evidence)
            .where(node_evidence.c.node == node)
            .order_by(node_evidence.c.seq.desc())
            .limit(limit)
        )
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query).mappings()]
        return rows[::-1]


def _put_node(c: Any, name: str, **values: Any) -> None:
    """Set these columns of the node's row, making the row if there is none."""
    done = c.execute(update(nodes).where(nodes.c.name == name).values(**values))
    if not done.rowcount:
        c.execute(nodes.insert().values(name=name, **({"cordoned": False} | values)))


def _ended_ids(c: Connection, table: Table, ids: list[str], ended: frozenset[str]) -> list[str]:
    """Those of `ids` whose row in `table` is in one of the `ended` states."""
    if not ids:
        return []
    query = select(table.c.id).where(table.c.id.in_(ids), table.c.state.in_(sorted(ended)))
    return [row[0] for row in c.execute(query)]


def _event(job_id: str | None, event: Event, now: float, actor: str = SYSTEM_ACTOR) -> Row:
    assert actor, "every event names its actor"
    return {
        "job_id": job_id,
        "kind": event[0],
        "message": event[1],
        "created_at": now,
        "actor": actor,
    }


HOLD_STARTS = "admitted"
HOLD_ENDS = ("pending", "attempt_lost", "stopped", "succeeded", "failed", "cancelled")
"""The events that give a job's devices back (a `cancelled` while pending has none)."""


def _hold(admitted: Row, end: float | None) -> Row:
    """One hold: from its `admitted` event's row to `end` (None: held still)."""
    return {
        "job_id": admitted["id"],
        "queue": admitted["queue"],
        "placement": admitted["placement"],
        "start": admitted["created_at"],
        "end": end,
    }
