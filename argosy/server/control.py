"""The control loop: submitted jobs in, scheduler decisions out, executor exits back in.

One `Control` owns the live scheduler (through `Scheduling`), the store and the
executor. Everything runs on the server's event loop, one step at a time, so the
scheduler never sees two callers. A step:

 1. collect attempts that ended (executor.poll) and apply what each exit means:
    succeeded, failed, cancelled, preempted back to pending, or lost and queued again
    to resume from its checkpoint (while attempts <= max_restarts);
 2. when something changed or `cycle_interval_s` passed, run one scheduler cycle and
    apply its decisions: start -> admitted -> executor.start -> running; preempt ->
    stop the attempt, back to pending; resize (an elastic job) -> stop the attempt (it
    checkpoints), then start it again at its new size (`argosy.server.tidal`);
 3. services: probes, restarts, and the tidal lease (yield, reclaim, relaunches of
    resized jobs once the devices they go to are free).

At start-up `recover()` reconciles the store with reality: pending jobs are queued
again, and every admitted or running job is either adopted (its attempt still runs:
it keeps its devices and is never started twice) or settled from the exit status its
attempt left behind.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from argosy.core.clock import Clock
from argosy.core.errors import ArgosyError
from argosy.executors.base import AttemptExit, Executor, LaunchRequest
from argosy.scheduler.decisions import Decision
from argosy.server.admission import job_user_name, os_readable
from argosy.server.config import ServerConfig
from argosy.server.energy import EnergyLedger
from argosy.server.energy_bounds import node_ceilings_w
from argosy.server.failures import error_clause
from argosy.server.field_errors import RefusedError
from argosy.server.job_goodput import job_account, kept_figures
from argosy.server.node_control import NodeControl, NotFoundError, known_inventory
from argosy.server.node_health import NodeHealth
from argosy.server.queue_limits import refuse_services_past, refuse_waiting_past
from argosy.server.resize_control import ResizeControl, placed_nodes
from argosy.server.retention import Retention
from argosy.server.scheduling import Scheduling
from argosy.server.schemas import ACTIVE, TERMINAL, Placement
from argosy.server.service_spec import ServiceSpec
from argosy.server.services import Services, is_replica
from argosy.server.spec import JobSpec
from argosy.server.store import SYSTEM_ACTOR, Row, Store
from argosy.server.summaries import (
    attempt_started,
    exit_time,
    read_exit_ahead,
    settle_summary,
    stamp_attempt,
)
from argosy.server.tidal import GRACE_ENV, RESIZE_GRACE_S, HttpReplicaAdmin, Lease, ReplicaAdmin
from argosy.server.views import public_launcher_error

log = logging.getLogger(__name__)
PAUSE_AFTER_S = 0.005
PAUSE_S = 0.002
"""The control loop's pass pauses `PAUSE_S` for requests after each of its parts (an exit
taken in, a decision applied) once `PAUSE_AFTER_S` went by since its last pause."""
RETENTION_EVERY_S = 60.0
"""How often ended jobs and services past the retention policy are removed (in batches of
`retention.BATCH`, the loop answering requests between them)."""
FREEZE_EVERY_S = 10.0
"""Jobs, workloads and rows pile up as long-lived objects; a full collection over them
costs tens of milliseconds, which lands on some request (the API's p99). Freezing them
(`gc.freeze`) every few seconds keeps full collections small."""


class WallClock:
    """Seconds since the epoch: submit times survive a server restart."""

    def now_s(self) -> float:
        return time.time()


class Control(ResizeControl, NodeControl):
    """Applies the scheduler's decisions and the executor's exits to the store."""

    def __init__(
        self,
        config: ServerConfig,
        store: Store,
        executor: Executor,
        *,
        clock: Clock | None = None,
        admin: ReplicaAdmin | None = None,
        probe: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.energy = EnergyLedger(store.engine, config.pue)
        self.executor = executor
        self.clock = clock or WallClock()
        self.scheduling = Scheduling(
            known_inventory(store, executor),
            config.queues_file,
            config.policy,
            config.scheduler,
            self.clock,
        )
        self.lease = Lease(store, admin or HttpReplicaAdmin(), _secret(config.home))
        self.services = Services(
            store,
            executor,
            self.scheduling,
            config.runs_dir,
            self.lease,
            probe=probe,
        )
        self.health = NodeHealth(store, config.node_policy)
        self.retention = Retention.of(config, store, self.clock.now_s, self.run_dir)
        self.last_retention_s = time.monotonic()
        self.cordoned: set[str] = set()
        self.lost: set[str] = set()
        self.last_nodes_s = time.monotonic()
        self.dirty = True
        self.last_cycle_s = 0.0
        self.cycle_s = 0.0
        self._wake: asyncio.Event | None = None

    # ---- start-up --------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the scheduler's state from the store and the executor."""
        self.cordoned = self.store.cordoned()
        listed = {n.name for n in self.executor.inventory()}
        lost_before = set(self.store.lost_since())  # lost before the restart: not lost again
        self.lost = (lost_before - listed) & set(self.scheduling.index)
        for name in self.cordoned | self.health.out_of_service() | self.lost:
            self._sync_node(name)
        self._check_nodes()
        self.scheduling.restore_past_use(self.store.holds_since, self.clock.now_s())
        for row in self.store.jobs_in(["pending", *ACTIVE]):
            spec = JobSpec.model_validate(row["spec"])
            if row["state"] == "pending":
                self._queue(row["id"], spec, row["created_at"])
                continue
            if row["state"] == "admitted" and row["reason"] == "resizing":
                # stopped for a resize, not relaunched: the relaunch's plan is gone
                self._queue(row["id"], spec, row["created_at"])
                self._back_to_pending(row["id"], {}, row["attempts"])
                continue
            ended = self.executor.adopt(row["id"], row["attempts"], self.run_dir(row["id"]))
            placement = Placement.model_validate(row["placement"]) if row["placement"] else None
            if ended is None and placement is not None:
                kept = self.scheduling.adopt(row["id"], spec, row["created_at"], placement)
                if kept:
                    self.store.add_event(row["id"], "adopted", "still running after a restart")
                    continue
                self.executor.stop(row["id"])
            self._queue(row["id"], spec, row["created_at"])
            self._take_exit(ended or _lost(row, "the server restarted without it"))
        self.services.recover()
        reap = getattr(self.executor, "reap", None)  # optional: work that outlives the server
        if reap is not None:
            reap()  # what nobody adopted is stale: its resources go back

    def _queue(
        self, job_id: str, spec: JobSpec, submit_s: float, actor: str = SYSTEM_ACTOR
    ) -> None:
        reason = self.scheduling.submit(job_id, spec, submit_s)
        if reason:
            self._finish(job_id, "failed", reason, ("rejected", reason), actor=actor)

    # ---- requests from the API -------------------------------------------------------
    def submit(
        self, spec: JobSpec, key: str | None, request_hash: str, *, actor: str = SYSTEM_ACTOR
    ) -> tuple[Row, bool]:
        field, reason = self.scheduling.check(spec)
        if reason:
            raise RefusedError(reason, field)
        refuse_waiting_past(
            self.config.max_pending_jobs_per_queue,
            spec.queue,
            self.scheduling.pending_in(spec.queue),
            answered=lambda: key is not None and self.store.job_by_key(key) is not None,
        )
        row, created = self.store.insert_job(
            spec.model_dump(),
            now=self.clock.now_s(),
            idempotency_key=key,
            request_hash=request_hash,
            actor=actor,
        )
        if created:
            self._queue(row["id"], spec, row["created_at"], actor)
            self.poke()
        return row, created

    def submit_service(self, spec: ServiceSpec, *, actor: str = SYSTEM_ACTOR) -> Row:
        held = sum(1 for r in self.services.active.values() if r["queue"] == spec.queue)
        refuse_services_past(self.config.max_services_per_queue, spec.queue, held)
        row = self.services.submit(spec, self.clock.now_s(), actor=actor)
        self.poke()
        return row

    def delete_service(self, service_id: str, *, actor: str = SYSTEM_ACTOR) -> Row:
        self.service(service_id)
        self.services.delete(service_id, actor=actor)
        self.poke()
        return self.service(service_id)

    def service(self, service_id: str) -> Row:
        row = self.store.get_service(service_id)
        if row is None:
            raise NotFoundError(f"no service '{service_id}'")
        return row

    def cancel(self, job_id: str, *, actor: str = SYSTEM_ACTOR) -> Row:
        """Cancel a job: a pending one at once, a running one when its attempt stops (the
        `cancelled` event then names the actor of the `cancel` event)."""
        row = self.job(job_id)
        if row["state"] in TERMINAL:
            return row
        if row["state"] == "pending" or self.lease.waiting(job_id):
            self.scheduling.finished(job_id)
            self.lease.forget(job_id)
            event = ("cancelled", "cancelled while pending")
            self._finish(job_id, "cancelled", "cancelled", event, actor=actor)
        else:
            self.store.update_job(
                job_id, {"stop_requested": "cancel"}, event=("cancel", "stopping"), actor=actor
            )
            self.executor.stop(job_id)
        return self.job(job_id)

    def readable(self, path: str) -> bool:
        """Whether the user jobs run as may read `path` (a directory: enter it); asked
        by admission before a job is stored (`JobIdentity.may_reach`)."""
        identity = self._identity()
        return os_readable(path) if identity is None else identity.may_reach(path)

    def job_user(self, queue: str | None) -> str | None:
        """The name of the user a job of `queue` runs as (admission's messages)."""
        return job_user_name(self._identity(), queue)

    def _identity(self) -> Any:
        return getattr(getattr(self.executor, "options", None), "identity", None)

    def job(self, job_id: str) -> Row:
        row = self.store.get_job(job_id)
        if row is None:
            raise NotFoundError(f"no job '{job_id}'")
        return row

    # ---- the loop --------------------------------------------------------------------
    def poke(self) -> None:
        self.dirty = True
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        self._wake = asyncio.Event()
        frozen_s = time.monotonic()
        while True:
            try:
                await self._step_in_parts()
            except Exception:  # a fault of ours must not stop scheduling for everyone
                log.exception("the control loop's step failed; it goes on")
            if time.monotonic() - frozen_s > FREEZE_EVERY_S:
                frozen_s = time.monotonic()
                gc.freeze()  # long-lived state leaves the collector's full scans
            woken = asyncio.ensure_future(self._wake.wait())
            try:  # not wait_for: on 3.11 it can swallow a cancel that meets the wake-up
                await asyncio.wait({woken}, timeout=self.config.poll_interval_s)
            finally:
                woken.cancel()
            self._wake.clear()

    async def _step_in_parts(self) -> None:
        """One pass of the loop, pausing `PAUSE_S` after each part once `PAUSE_AFTER_S`
        went by without a pause: a request in flight needs several turns of the event
        loop (its body, the handler, the answer), which one `sleep(0)` would give it one
        at a time, a start apart."""
        paused_s = time.monotonic()
        for part in self._step_parts():
            if part is not None:  # reading only: in a worker thread, the loop answers
                await asyncio.to_thread(part)
                paused_s = time.monotonic()
            elif time.monotonic() - paused_s >= PAUSE_AFTER_S:
                await asyncio.sleep(PAUSE_S)
                paused_s = time.monotonic()

    def step(self) -> None:
        """One pass of the loop, all at once (`run` takes it part by part)."""
        for part in self._step_parts():
            if part is not None:
                part()

    def _step_parts(self) -> Iterator[Callable[[], None] | None]:
        """One pass of the loop, pausing after each exit taken in and each decision
        applied: the server answers requests in between, so a burst of starts (each a
        process, a cgroup, perhaps a user) does not hold the API for all of them. What a
        request changed meanwhile (a cancel) is checked by the part that acts on it.
        A part that only reads (what a job's exit left, parsed ahead) is yielded as a
        callable, run off the event loop."""
        now = time.monotonic()
        if now - self.last_nodes_s >= self.config.nodes_interval_s:
            self.last_nodes_s = now
            self._check_nodes()
            yield None
        for ended in self.executor.poll():
            if not is_replica(ended.job_id):
                yield self._reader_of(ended)
            self._take_exit(ended)
            yield None
        since = now - self.last_cycle_s
        if (
            self.dirty and since >= self.config.min_cycle_gap_s
        ) or since >= self.config.cycle_interval_s:
            self.dirty = False
            self.last_cycle_s = now
            decisions = self.scheduling.cycle()
            self.cycle_s = time.monotonic() - now
            for d in decisions:
                self._apply_safely(d)
                yield None
        self.services.step(now)
        if self.lease.resizes:
            yield None
            self._relaunch_resized()
            self.lease.watch(self.run_dir, self._devices_of)
        if self.retention.policy.on and now - self.last_retention_s >= RETENTION_EVERY_S:
            self.last_retention_s = now
            yield from self.retention.parts()

    def _reader_of(self, e: AttemptExit) -> Callable[[], None]:
        """What parses the files `_take_exit(e)` will read (`summaries.read_exit_ahead`),
        for a worker thread; a failure there only leaves the reading to the loop."""
        row = self.store.get_job(e.job_id)
        ranks = max(1, len(placed_nodes(row))) if row else 1
        run_dir = self.run_dir(e.job_id)

        def read() -> None:
            try:
                read_exit_ahead(run_dir, ranks)
            except Exception:  # the job's files: the loop reads them again and says why
                log.exception("reading the exit of %s ahead failed", e.job_id)

        return read

    def _apply_safely(self, d: Decision) -> None:
        """Apply one decision; should that fail, the loop goes on with the cycle's other
        decisions (the scheduler already counts them) and a job whose start failed goes
        back to pending in the scheduler too, so it is started again, not orphaned."""
        try:
            self._apply(d)
        except Exception:
            job_id = d.workload.id
            log.exception("applying %s of %s failed", d.action, job_id)
            if d.action != "start":
                return
            try:
                row = self.store.get_job(job_id)
                if row is not None and row["state"] == "pending":
                    self.scheduling.requeue(job_id)
                    self.poke()
            except Exception:
                log.exception("queueing %s again failed", job_id)

    def _apply(self, d: Decision) -> None:
        job_id = d.workload.id
        if d.action in ("start", "preempt") and self._ended(job_id):
            return  # cancelled since the cycle decided (requests run between decisions)
        if d.action == "start":
            if not self.scheduling.is_running(job_id):
                return  # stopped again later in the same cycle: it is pending there
            if self._devices_still_held(job_id):
                self.scheduling.requeue(job_id)  # placed again once they are free
                self.poke()
                return
            self._start(job_id)
        elif d.action == "replicas":
            self.services.placed(job_id)
        elif d.action == "preempt":
            self.store.update_job(
                job_id, {"stop_requested": "preempt"}, event=("preempted", d.reason)
            )
            if self.lease.waiting(job_id):  # no attempt runs: it is pending at once
                self.lease.forget(job_id)
                values = {"state": "pending", "reason": "preempted", "stop_requested": None}
                self.store.update_job(job_id, values, event=("pending", "preempted while resizing"))
            self.executor.stop(job_id)
        elif d.action == "resize":
            self._resize(job_id, d)
        else:
            self.store.add_event(job_id, d.action, d.reason or "scheduler decision")

    def _devices_still_held(self, job_id: str) -> bool:
        """Whether the job was placed on devices still held: by a replica until it is
        asleep (a tidal service's shrink gives its device out at once), or, by the
        executor's count, by an attempt stopped for it (a preemption checkpoints first)."""
        held = self.services.held_beyond_slots()
        nodes = self.scheduling.placement(job_id).nodes
        on_replica = any(self.scheduling.free_on(n) < held.get(n, 0) for n in nodes)
        return on_replica or self.executor.devices_busy(nodes)

    def _ended(self, job_id: str) -> bool:
        row = self.store.get_job(job_id)
        return row is None or row["state"] in TERMINAL

    def _devices_of(self, job_id: str) -> int:
        w = self.scheduling.workloads.get(job_id)
        return w.devices if w is not None else 0

    def _start(self, job_id: str) -> None:
        row = self.job(job_id)
        spec = JobSpec.model_validate(row["spec"])
        placement = self.scheduling.placement(job_id)
        attempt = row["attempts"] + 1
        where = ", ".join(f"{n}: {k} {placement.chip}" for n, k in placement.nodes.items())
        self.store.update_job(
            job_id,
            {
                "state": "admitted",
                "attempts": attempt,
                "placement": placement.model_dump(),
                "stop_requested": None,
            },
            event=("admitted", f"attempt {attempt} on {where}"),
        )
        request = self._request(job_id, attempt, spec, placement)
        stamp_attempt(request.run_dir, attempt)
        try:
            self.executor.start(request)
        except (OSError, ArgosyError) as err:
            self._apply_exit(AttemptExit(job_id, attempt, None, True, f"could not start: {err}"))
            return
        values: dict[str, Any] = {"state": "running"}
        if row["started_at"] is None:
            values["started_at"] = self.clock.now_s()
        seen = self.executor.devices_of(job_id)
        started = f"attempt {attempt} started" + (f" ({seen})" if seen else "")
        self.store.update_job(job_id, values, event=("running", started))

    def _request(self, job_id: str, attempt: int, spec: JobSpec, p: Placement) -> LaunchRequest:
        env = {"ARGOSY_SERVER_ATTEMPT": str(attempt)}
        if spec.checkpoint_every is not None:
            env["ARGOSY_CHECKPOINT_EVERY"] = str(spec.checkpoint_every)
        if spec.elastic is not None:  # a resize's stop waits for the checkpoint to be durable
            env[GRACE_ENV] = str(RESIZE_GRACE_S)
        return LaunchRequest(
            job_id=job_id,
            attempt=attempt,
            script=spec.script,
            args=tuple(spec.args),
            nproc_per_node=spec.nproc_per_node,
            run_dir=self.run_dir(job_id),
            nodes=p.nodes,
            chip=p.chip,
            workdir=spec.workdir,
            max_restarts=spec.max_restarts,
            env=env,
            inject=tuple(spec.inject) if attempt == 1 else (),
            queue=spec.queue,
        )

    def run_dir(self, job_id: str) -> Path:
        return self.config.runs_dir / job_id

    # ---- exits -----------------------------------------------------------------------
    def _take_exit(self, e: AttemptExit) -> None:
        """Apply an attempt's exit. What it left is the job's writing: should taking it in
        fail, the job (or replica) fails with the reason and the loop goes on, for every
        other tenant's work, and a restarted server does not replay the failure."""
        try:
            if is_replica(e.job_id):
                self.services.apply_exit(e)
            else:
                self._apply_exit(e)
        except Exception as err:
            log.exception("taking in the exit of %s attempt %s failed", e.job_id, e.attempt)
            if not is_replica(e.job_id):
                self._fail_unreadable(e, err)

    def _fail_unreadable(self, e: AttemptExit, err: Exception) -> None:
        row = self.store.get_job(e.job_id)
        if row is None or row["attempts"] != e.attempt or row["state"] not in ACTIVE:
            return
        self.scheduling.finished(e.job_id)
        why = f"attempt {e.attempt}: the server could not take in what it left ({err!r:.300})"
        summary = {"status": "invalid", "detail": why, "attempt": e.attempt}
        extra = {"exit_code": e.exit_code, "summary": summary, "stop_requested": None}
        self._finish(e.job_id, "failed", why, ("failed", why), extra)

    def _apply_exit(self, e: AttemptExit) -> None:
        row = self.store.get_job(e.job_id)
        if row is None or row["attempts"] != e.attempt or row["state"] not in ACTIVE:
            return
        self.poke()
        if e.lost:
            self._check_nodes()  # a lost node goes out of placement before the requeue
        nodes, n, run_dir = placed_nodes(row), e.attempt, self.run_dir(e.job_id)
        ended_s = exit_time(run_dir, n, self.clock.now_s())
        started_s = attempt_started(run_dir, n) or row["started_at"] or ended_s
        span = (min(started_s, ended_s), ended_s)
        stop = row["stop_requested"]
        summary = settle_summary(run_dir, n, e.reason, nodes, span, _ending(e, stop))
        summary["job"] = job_account(kept_figures(run_dir, n))
        base = {"exit_code": e.exit_code, "summary": summary, "stop_requested": None}
        self._absorb_node_health(row["id"], nodes, *span, e.lost_node_ranks)
        ceilings = node_ceilings_w(row["placement"])
        window = {"started_s": span[0], "ceilings_w": ceilings}
        self.energy.record_attempt(e.job_id, n, nodes, summary, ended_s, **window)
        ended = base | {"finished_at": ended_s}
        spec = JobSpec.model_validate(row["spec"])
        if stop == "cancel":
            self.scheduling.finished(e.job_id)
            who = self.store.last_actor(e.job_id, "cancel")  # the request's actor, not ours
            self._finish(
                e.job_id,
                "cancelled",
                "cancelled",
                ("cancelled", f"attempt {n} stopped"),
                ended,
                actor=who,
            )
        elif stop == "resize" and e.exit_code != 0:
            self._resize_stopped(e.job_id, base, n)
        elif stop == "preempt":
            self.store.update_job(
                e.job_id,
                base | {"state": "pending", "reason": "preempted"},
                event=("pending", f"attempt {n} stopped by preemption; queued again"),
            )
        elif e.exit_code == 0:
            self.scheduling.finished(e.job_id)
            event = ("succeeded", f"attempt {n} {e.reason}")
            self._finish(e.job_id, "succeeded", "", event, ended)
        elif e.lost and self._losses(e.job_id) < spec.max_restarts:
            self.scheduling.requeue(e.job_id)
            why = f"attempt {n} lost: {e.reason}; queued again to resume from its checkpoint"
            self.store.update_job(
                e.job_id, base | {"state": "pending", "reason": why}, event=("attempt_lost", why)
            )
        else:
            self.scheduling.finished(e.job_id)
            why = f"attempt {n}: {e.reason}" + _cause(summary)
            why += error_clause(public_launcher_error(self.run_dir(e.job_id), n), why)
            if e.lost:
                why += f" (max_restarts={spec.max_restarts} used up)"
            self._finish(e.job_id, "failed", why, ("failed", why), ended)

    def _losses(self, job_id: str) -> int:
        """Attempts of the job lost and queued again so far: what `max_restarts` bounds
        (an attempt stopped for a resize or a preemption is no loss)."""
        return self.store.count_events(job_id, "attempt_lost")

    def _finish(
        self,
        job_id: str,
        state: str,
        reason: str,
        event: tuple[str, str],
        extra: Row | None = None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> None:
        now = self.clock.now_s()
        values = {"finished_at": now} | (extra or {}) | {"state": state, "reason": reason}
        self.store.update_job(job_id, values, event=event, actor=actor)


def _secret(home: Path) -> bytes:
    """The server's admin token (replica admin tokens derive from it), else a random key."""
    try:
        return (home / "admin.token").read_bytes().strip() or secrets.token_bytes(32)
    except OSError:
        return secrets.token_bytes(32)


def _lost(row: Row, reason: str) -> AttemptExit:
    return AttemptExit(row["id"], row["attempts"], None, True, reason)


def _ending(e: AttemptExit, stop: str | None) -> str:
    """How the server takes an attempt's end (`job_goodput.ENDINGS`), as `_apply_exit`
    acts on it."""
    if stop in ("cancel", "preempt") or (stop == "resize" and e.exit_code != 0):
        return "stopped"
    if e.exit_code == 0:
        return "succeeded"
    return "lost" if e.lost else "failed"


def _cause(summary: dict | None) -> str:
    cause = (summary or {}).get("cause")
    if isinstance(cause, dict) and cause.get("detail"):
        return f"; cause: {cause['detail']}"
    return ""
