"""Read-only queries the console needs beyond the store's own: a newest-first page of
jobs with only the columns a table shows, counts under a filter, and the allocation
series behind the overview chart. Every query is bounded (a page, a time window), so a
page costs the same with 10 or 10,000 jobs stored.

    page = job_page(store, JobFilter(state="running"), before=None, limit=50)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Select, and_, func, or_, select

from argosy.server.store import JOB_ETT, Row, Store
from argosy.server.tables import events, jobs, services

PAGE_COLUMNS = (
    jobs.c.seq,
    jobs.c.id,
    jobs.c.name,
    jobs.c.queue,
    jobs.c.state,
    jobs.c.attempts,
    jobs.c.created_at,
    jobs.c.started_at,
    jobs.c.finished_at,
    jobs.c.reason,
)


@dataclass(frozen=True)
class JobFilter:
    """The jobs table's filters; empty strings mean 'any'."""

    state: str = ""
    queue: str = ""
    name: str = ""

    def apply(self, query: Select) -> Select:
        if self.state:
            query = query.where(jobs.c.state == self.state)
        if self.queue:
            query = query.where(jobs.c.queue == self.queue)
        if self.name:
            query = query.where(jobs.c.name.startswith(self.name, autoescape=True))
        return query


@dataclass
class JobPage:
    """Newest first; `older` is the cursor of the next page (None on the last one)."""

    rows: list[Row]
    older: int | None
    total: int


def job_page(store: Store, flt: JobFilter, before: int | None, limit: int) -> JobPage:
    query = flt.apply(select(*PAGE_COLUMNS)).order_by(jobs.c.seq.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(jobs.c.seq < before)
    with store.engine.connect() as c:
        rows = [dict(r) for r in c.execute(query).mappings()]
        total = c.execute(flt.apply(select(func.count()).select_from(jobs))).scalar_one()
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(rows, rows[-1]["seq"] if more and rows else None, int(total))


def pending_jobs(store: Store, queue: str, limit: int) -> list[Row]:
    """The oldest pending jobs of one queue (the head of its line), with their spec."""
    query = (
        select(jobs.c.id, jobs.c.name, jobs.c.spec, jobs.c.reason, jobs.c.created_at)
        .where(and_(jobs.c.queue == queue, jobs.c.state == "pending"))
        .order_by(jobs.c.seq)
        .limit(limit)
    )
    with store.engine.connect() as c:
        return [dict(r) for r in c.execute(query).mappings()]


def mean_effective_training_time(store: Store) -> tuple[float | None, int]:
    """Mean effective training time over finished jobs that report one (each over all
    its attempts where the server folded them: `JOB_ETT`)."""
    query = select(func.avg(JOB_ETT), func.count(JOB_ETT)).where(jobs.c.finished_at.is_not(None))
    with store.engine.connect() as c:
        mean, count = c.execute(query).one()
    return (float(mean) if mean is not None else None), int(count)


@dataclass
class Series:
    """Device counts over time: allocated, and allocated x effective training time."""

    times_s: list[float] = field(default_factory=list)
    allocated: list[float] = field(default_factory=list)
    useful: list[float] = field(default_factory=list)


def allocation_series(
    store: Store,
    now_s: float,
    window_s: float,
    buckets: int,
    live: dict[str, float] | None = None,
) -> Series:
    """Devices held by jobs in each of `buckets` steps of the last `window_s` seconds.

    A job holds `nproc_per_node x nnodes` devices from its first start to its finish (a
    requeue gap counts as held: an upper bound). Useful = held x the job's effective
    training time: from its summary, or for a job still running from `live` (job id ->
    its effective training time so far); a job with neither counts as 0 useful.
    """
    live = live or {}
    start_s = now_s - window_s
    spec = jobs.c.spec
    devices = spec["nproc_per_node"].as_integer() * spec["nnodes"].as_integer()
    query = select(
        jobs.c.id,
        jobs.c.started_at,
        jobs.c.finished_at,
        devices,
        JOB_ETT,
    ).where(
        and_(
            jobs.c.started_at.is_not(None),
            or_(jobs.c.finished_at.is_(None), jobs.c.finished_at > start_s),
        )
    )
    step_s = window_s / buckets
    out = Series(times_s=[start_s + (i + 1) * step_s for i in range(buckets)])
    out.allocated = [0.0] * buckets
    out.useful = [0.0] * buckets
    with store.engine.connect() as c:
        for job_id, started, finished, count, ett in c.execute(query):
            useful = ett if ett is not None else live.get(job_id, 0.0)
            _add_span(out, start_s, step_s, started, finished or now_s, count or 1, useful)
    return out


def _add_span(
    out: Series, start_s: float, step_s: float, begin: float, end: float, n: int, ett: float
) -> None:
    """Spread one job's held devices over the buckets its span overlaps (only those)."""
    first = max(0, int((begin - start_s) // step_s))
    last = min(len(out.times_s) - 1, int((end - start_s) // step_s))
    for i in range(first, last + 1):
        t = out.times_s[i]
        lo = max(begin, t - step_s)
        hi = min(end, t)
        if hi > lo:
            share = (hi - lo) / step_s
            out.allocated[i] += n * share
            out.useful[i] += n * share * ett


def service_page(store: Store, before: int | None, limit: int) -> tuple[list[Row], int | None]:
    query = select(services).order_by(services.c.seq.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(services.c.seq < before)
    with store.engine.connect() as c:
        rows = [dict(r) for r in c.execute(query).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1]["seq"] if more and rows else None)


REPLICA_UP = ("replica_ready",)
REPLICA_DOWN = (
    "replica_started",
    "replica_exited",
    "replica_stopped",
    "replica_failed",
    "replica_unhealthy",
)
MAX_REPLICA_EVENTS = 20_000


def ready_replicas(
    store: Store, service_ids: list[str], now_s: float, window_s: float
) -> dict[str, tuple[list[float], list[int]]]:
    """Ready replicas of each service over the last `window_s`, as step points replayed
    from its replica events (`replica_ready` adds one; a start, exit, stop, failure or
    failed probe takes that replica out)."""
    start_s = now_s - window_s
    query = (
        select(events.c.job_id, events.c.kind, events.c.message, events.c.created_at)
        .where(events.c.job_id.in_(service_ids), events.c.kind.in_(REPLICA_UP + REPLICA_DOWN))
        .order_by(events.c.seq)
        .limit(MAX_REPLICA_EVENTS)
    )
    ready: dict[str, set[str]] = {sid: set() for sid in service_ids}
    out = {sid: ([start_s], [0]) for sid in service_ids}
    with store.engine.connect() as c:
        for sid, kind, message, at_s in c.execute(query):
            replicas = ready[sid]
            index = message.split()[1] if message.startswith("replica ") else message
            (replicas.add if kind in REPLICA_UP else replicas.discard)(index)
            times, counts = out[sid]
            if at_s <= start_s:
                counts[0] = len(replicas)
            elif len(replicas) != counts[-1]:
                times.append(at_s)
                counts.append(len(replicas))
    for sid, (times, counts) in out.items():
        times.append(now_s)
        counts.append(len(ready[sid]))
    return out
