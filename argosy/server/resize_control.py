"""The control loop's elastic resizes: a job's stop to resize, and its relaunch.

`ResizeControl` is the part of `argosy.server.control.Control` that carries out the
scheduler's `resize` decisions through the tidal lease (`argosy.server.tidal.Lease`):
the job's attempt is stopped (it checkpoints), and the job starts again at its new size
once no awake replica holds a device of its new placement. A job whose new placement
went out of service meanwhile, or whose resize a server restart interrupted, goes back
to pending instead (sized anew; its attempt is not counted as lost).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from argosy.executors.base import Executor
from argosy.scheduler.decisions import Decision
from argosy.server.scheduling import Scheduling
from argosy.server.schemas import ACTIVE
from argosy.server.services import Services
from argosy.server.store import Row, Store
from argosy.server.tidal import Lease


def placed_nodes(row: Row) -> list[str]:
    """The nodes of the job's placement, by node rank (none before it is placed)."""
    return list((row["placement"] or {}).get("nodes") or {})


class ResizeControl:
    """Resizes over the control loop's scheduler, store, executor and lease."""

    store: Store
    executor: Executor
    scheduling: Scheduling
    services: Services
    lease: Lease
    lost: set[str]
    poke: Callable[[], None]
    job: Callable[[str], Row]
    run_dir: Callable[[str], Path]
    _start: Callable[[str], None]

    def _resize(self, job_id: str, d: Decision) -> None:
        row = self.job(job_id)
        if row["state"] not in ACTIVE:
            return
        old = set(placed_nodes(row))
        new = set(self.scheduling.placement(job_id).nodes)
        lenders = {n: who for n in sorted(new - old) if (who := self.services.lender(n))}
        if self.lease.resize(row, d.before, d.after, d.reason, lenders):
            self.executor.stop(job_id)

    def _resize_stopped(self, job_id: str, base: Row, attempt: int) -> None:
        """The attempt a resize stopped has ended: the job waits for its new devices; or,
        when the server restarted since it asked the stop (the lease forgot the resize),
        it goes back to pending."""
        if job_id not in self.lease.resizes:
            self.scheduling.requeue(job_id)
            self._back_to_pending(job_id, base, attempt)
            return
        self.lease.stopped(job_id, self.run_dir(job_id))
        why = f"attempt {attempt} stopped to resize; starts again when its devices are free"
        values = base | {"state": "admitted", "reason": "resizing"}
        self.store.update_job(job_id, values, event=("stopped", why))

    def _relaunch_resized(self) -> None:
        """Start each resized job whose old ranks are gone once the devices of its new
        placement are free (no awake replica nor stopping attempt holds them: the
        executor's count, device by device)."""
        for job_id in list(self.lease.resizes):
            if not self.lease.waiting(job_id):
                continue
            if not self.scheduling.is_running(job_id):  # it went back to pending meanwhile
                self.lease.forget(job_id)
                continue
            placed = self.scheduling.placement(job_id).nodes
            if self._gone_out(job_id, set(placed)):
                continue
            if self.lease.ready_to_relaunch(job_id, self.executor.devices_busy(placed)):
                self._start(job_id)
                self.lease.launched(job_id)

    def _gone_out(self, job_id: str, nodes: set[str]) -> bool:
        """Whether a node of the resized job's new placement went out of service while its
        ranks stopped (lost; or cordoned or unhealthy, and not held by the stopped attempt):
        it then goes back to pending, sized anew, instead of starting there (no loss)."""
        row = self.job(job_id)
        gained = nodes - set(placed_nodes(row))
        out = (nodes & self.lost) | (gained & self.scheduling.out_of_service)
        if not out:
            return False
        self.scheduling.requeue(job_id)
        self.lease.forget(job_id)
        why = f"nodes of its resize went out of service ({', '.join(sorted(out))}); queued again"
        values = {"state": "pending", "reason": "resizing onto nodes out of service"}
        self.store.update_job(job_id, values, event=("pending", why))
        self.poke()
        return True

    def _back_to_pending(self, job_id: str, values: Row, attempt: int) -> None:
        """A resize that a server restart interrupted: the job waits again, as pending (the
        scheduler sizes it anew), its attempt not counted as lost."""
        why = "resizing interrupted by a server restart"
        values = values | {"state": "pending", "reason": why, "stop_requested": None}
        event = ("pending", f"attempt {attempt} stopped to resize; {why}; queued again")
        self.store.update_job(job_id, values, event=event)
