"""How long the store keeps ended jobs and services: per queue, the newest by end.

Every submit writes a row and its events, and a cancel ends it at once; without a bound
a tenant looping over both grows the store (and every listing) without end. Slurm purges
its accounting after `PurgeJobAfter`; Kubernetes removes a finished Job after
`ttlSecondsAfterFinished`. Here, per queue:

- at most `keep_finished_per_queue` ended jobs, and as many ended services, are kept,
  the newest by the time they ended (0: all);
- none that ended more than `keep_finished_days` ago (0: no age limit);
- but a job that held devices is kept until it ended `PAST_USE_HALF_LIVES` usage
  half-lives ago, whatever the count: the queues' fair-share use is rebuilt from what
  held devices at a server's start (`Store.holds_since`), and a tenant could otherwise
  wash its own history out with a flood of empty jobs. Its share has decayed to 1/32
  by then.

A removed job goes with its events (one transaction); its run directory (a service's:
its replicas' run directories) stays under `runs_dir` unless `prune_run_dirs` (it holds
the job's logs and checkpoints). A removed
job's id is then unknown to the API (404), and its Idempotency-Key free again.

    chosen = ended_to_remove(store.engine, policy, now_s=time.time())
    store.remove_ended(chosen.jobs, chosen.services)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import ColumnElement, Engine, Table, func, or_, select

from argosy.core.trees import remove_trees
from argosy.server.config import ServerConfig
from argosy.server.schemas import SERVICE_TERMINAL, TERMINAL
from argosy.server.store import Store
from argosy.server.tables import jobs, services

log = logging.getLogger(__name__)

PAST_USE_HALF_LIVES = 5
"""A job that held devices is kept at least this many usage half-lives after it ended."""
RM_TIMEOUT_S = 600
"""The longest one `rm` of run directories may take (off the event loop)."""
BATCH = 500
"""The most jobs (and services) one removal takes: the control loop pauses between them
(a pass goes on, batch after batch, while batches come full)."""


@dataclass(frozen=True)
class RetentionPolicy:
    """What the store keeps (`ServerConfig.keep_finished_*`, the usage half-life)."""

    keep_per_queue: int = 10_000
    keep_days: float = 0.0
    half_life_s: float = 86_400.0

    @property
    def on(self) -> bool:
        return self.keep_per_queue > 0 or self.keep_days > 0


@dataclass
class Chosen:
    """Ids of ended jobs and services to remove."""

    jobs: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.services)


def ended_to_remove(engine: Engine, policy: RetentionPolicy, now_s: float) -> Chosen:
    """The ended jobs and services the policy no longer keeps, at most `BATCH` of each,
    the oldest first."""
    if not policy.on:
        return Chosen()
    held_before = now_s - PAST_USE_HALF_LIVES * policy.half_life_s
    job_ended = func.coalesce(jobs.c.finished_at, jobs.c.updated_at)
    never_held = jobs.c.started_at.is_(None)
    chosen_jobs = _beyond(
        engine,
        jobs,
        jobs.c.state.in_(sorted(TERMINAL)),
        job_ended,
        policy,
        now_s,
        or_(never_held, job_ended < held_before),
    )
    chosen_services = _beyond(
        engine,
        services,
        services.c.state.in_(sorted(SERVICE_TERMINAL)),
        services.c.updated_at,
        policy,
        now_s,
    )
    return Chosen(chosen_jobs, chosen_services)


def _beyond(
    engine: Engine,
    table: Table,
    ended: ColumnElement[bool],
    ended_at: ColumnElement[float],
    policy: RetentionPolicy,
    now_s: float,
    may_go: ColumnElement[bool] | None = None,
) -> list[str]:
    """Ids of `table`'s ended rows past the queue's count or age, that `may_go` allows."""
    rank = (
        func.row_number()
        .over(partition_by=table.c.queue, order_by=(ended_at.desc(), table.c.seq.desc()))
        .label("rank")
    )
    ranked = select(table.c.id, ended_at.label("ended_at"), rank).where(ended)
    if may_go is not None:
        ranked = ranked.add_columns(may_go.label("may_go"))
    ranked = ranked.subquery()
    past = []
    if policy.keep_per_queue > 0:
        past.append(ranked.c.rank > policy.keep_per_queue)
    if policy.keep_days > 0:
        past.append(ranked.c.ended_at < now_s - policy.keep_days * 86_400.0)
    query = select(ranked.c.id).where(or_(*past))
    if may_go is not None:
        query = query.where(ranked.c.may_go)
    query = query.order_by(ranked.c.ended_at).limit(BATCH)
    with engine.connect() as c:
        return [row[0] for row in c.execute(query)]


def remove_run_dirs(run_dirs: list[Path]) -> None:
    """Remove the run directories of removed jobs (`prune_run_dirs`): a job's tree, deep
    perhaps, with links and mounts (`core.trees`)."""
    remove_trees([t for t in run_dirs if t.is_dir() and not t.is_symlink()], RM_TIMEOUT_S)


class Retention:
    """The control loop's passes over the store: `choose` reads (off the event loop),
    `apply` removes what it chose, and `sweep` removes their run directories."""

    def __init__(
        self,
        store: Store,
        policy: RetentionPolicy,
        now_s: Callable[[], float],
        run_dir_of: Callable[[str], Path] | None = None,
    ) -> None:
        self.store, self.policy, self.now_s, self.run_dir_of = store, policy, now_s, run_dir_of
        self.chosen = Chosen()
        self.swept: list[Path] = []

    @classmethod
    def of(
        cls, config: ServerConfig, store: Store, now_s: Callable[[], float],
        run_dir_of: Callable[[str], Path],
    ) -> Retention:  # fmt: skip
        """The server config's policy; run directories removed with `prune_run_dirs`."""
        policy = RetentionPolicy(
            config.keep_finished_per_queue,
            config.keep_finished_days,
            config.scheduler.usage_half_life_s,
        )
        return cls(store, policy, now_s, run_dir_of if config.prune_run_dirs else None)

    def choose(self) -> None:
        self.chosen = ended_to_remove(self.store.engine, self.policy, self.now_s())

    def apply(self) -> int:
        """Remove what `choose` chose (those still ended); how many it had chosen: a full
        `BATCH` means more may be waiting."""
        chosen, self.chosen = self.chosen, Chosen()
        if not chosen:
            return 0
        gone = set(self.store.remove_ended(chosen.jobs, chosen.services))
        jobs_gone = [j for j in chosen.jobs if j in gone]
        if self.run_dir_of is not None:  # a service's replicas run under its id's folder
            self.swept += [self.run_dir_of(i) for i in (*jobs_gone, *chosen.services) if i in gone]
        log.info("removed %d ended jobs, %d services", len(jobs_gone), len(gone) - len(jobs_gone))
        return max(len(chosen.jobs), len(chosen.services))

    def parts(self) -> Iterator[Callable[[], None] | None]:
        """One pass, as the control loop's parts (`Control._step_parts`): batch after
        batch while they come full (a flood goes as fast as it comes), the reading and the
        removal of run directories off the event loop."""
        full = True
        while full:
            yield self.choose
            full = self.apply() >= BATCH
        if self.swept:
            yield self.sweep

    def sweep(self) -> None:
        swept, self.swept = self.swept, []
        remove_run_dirs(swept)
