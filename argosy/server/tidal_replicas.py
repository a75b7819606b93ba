"""Tidal services on the control loop: the part of `Services` that follows the scheduler's
replica target with the lease (`argosy.server.tidal.Lease`) and the executor's devices.

Each control step, per tidal service: replicas placed again start (`missing`); asleep ones
lend their devices to the executor (`Executor.lend`, said again after a restart); the
lease yields those past the target and wakes those placed again, each once it has its
own device back (`_take_back`). An asleep replica placed again on another node, or whose
device another attempt keeps past `TAKEN_GRACE_S`, starts afresh instead (`_afresh`).
Where the executor cannot lend a sleeping replica's device (Ray), a yield is a stop
(`_yield_by_stop`) and a reclaim a fresh start. None of these stops counts as a failure
or a restart (`STOPS_NOT_COUNTED`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from argosy.executors.base import Executor
from argosy.server.scheduling import Scheduling
from argosy.server.store import Row, Store
from argosy.server.tidal import Lease, replica_record

DEVICE_TAKEN = "its device was taken by another attempt while it slept; it starts afresh"
MOVED = "placed on another node while it slept (its process keeps its own device); it starts there"
TAKEN_GRACE_S = 90.0
"""How long an asleep replica placed again waits for its device (training ranks stopping
for a resize hold it until they exit: `tidal.RESIZE_GRACE_S`) before it starts afresh."""
YIELD_BY_STOP = "stopped to lend its device (this executor cannot lend a sleeping replica's)"
STOPS_NOT_COUNTED = (DEVICE_TAKEN, MOVED, YIELD_BY_STOP)
"""Why the control plane stopped a replica, where that stop is not the replica's failure."""


def replica_key(service_id: str, index: int) -> str:
    """The executor's name for one replica (its 'job id')."""
    return f"{service_id}.r{index}"


class TidalReplicas:
    """The tidal part of `Services` (a base of it): what it needs of `Services` is
    declared here."""

    active: dict[str, Row]
    executor: Executor
    scheduling: Scheduling
    lease: Lease
    store: Store
    _stop_reasons: dict[str, str]
    _taken_since: dict[str, float]
    placed: Callable[[str], None]
    _save: Callable[[Row], None]

    def _replica(self, key: str) -> tuple[Row | None, dict[str, Any] | None]:
        """The service row and the record of the replica whose attempts are `key`."""
        service_id, _, index = key.rpartition(".r")
        row = self.active.get(service_id)
        return row, replica_record(row, int(index))

    def _reconcile_tidal(self) -> None:
        for service_id, row in list(self.active.items()):
            if row["stop_requested"]:
                continue
            if not row["spec"].get("tidal"):
                if any(r.get("waiting") for r in row["replicas"]):
                    self.placed(service_id)  # its device was held by a yielding replica
                continue
            wanted = self.scheduling.replica_nodes(service_id)
            if not self.executor.lends_sleeping and self._yield_by_stop(row, len(wanted)):
                self._save(row)
            if missing(row, len(wanted)):
                self.placed(service_id)  # a replica to start once its node is free
            for r in row["replicas"]:
                if r["state"] == "asleep":  # its device is lent (said again after a restart)
                    self.executor.lend(replica_key(service_id, r["index"]))
            if needs_lease(row, len(wanted)) and self.lease.reconcile(
                row, wanted, row["spec"]["model"], self._take_back
            ):
                self._save(row)

    def _yield_by_stop(self, row: Row, wanted: int) -> bool:
        """Where the executor cannot lend a sleeping replica's device, a replica the
        scheduler dropped yields by stopping (yielding: it holds its device until it is
        gone), and is started afresh when placed again; whether a record changed."""
        changed = False
        for rec in row["replicas"]:
            if rec["index"] >= wanted and rec["state"] == "ready":
                key = replica_key(row["id"], rec["index"])
                self._stop_reasons[key] = YIELD_BY_STOP
                self.executor.stop(key)
                rec["state"], changed = "yielding", True
                what = f"replica {rec['index']} yields {rec['node']}: {YIELD_BY_STOP}"
                self.store.add_event(row["id"], "yield", what)
                self.lease.counts["yield"] += 1  # (`/metrics`: a transition, no sleep time)
        return changed

    def _take_back(self, key: str, node: str) -> bool:
        """Whether an asleep replica placed again on `node` may wake: its process sleeps
        on its own node's device, which it must have back. Placed on another node, it
        starts afresh there; its device held by another attempt past `TAKEN_GRACE_S`
        (not ranks that stop for a resize: they are gone sooner), afresh on a free one."""
        _, rec = self._replica(key)
        if rec is None or rec.get("node") != node:
            return self._afresh(key, MOVED)
        if self.executor.take_back(key):
            self._taken_since.pop(key, None)
            return True
        since = self._taken_since.setdefault(key, time.monotonic())
        if time.monotonic() - since >= TAKEN_GRACE_S:
            self._afresh(key, DEVICE_TAKEN)
        return False

    def _afresh(self, key: str, why: str) -> bool:
        """Stop an asleep replica so that it starts afresh (its exit restarts it where it
        is placed, not counted as a restart); False: it does not wake."""
        self._taken_since.pop(key, None)
        if key not in self._stop_reasons:
            self._stop_reasons[key] = why
            self.executor.stop(key)
        return False


def missing(row: Row, wanted: int) -> bool:
    """A replica the scheduler placed has no record yet, waits for its node, or exited
    while it was not wanted (its device lent) and is wanted again."""
    records = {r["index"]: r for r in row["replicas"]}
    return any(
        i not in records
        or records[i].get("waiting")
        or (records[i]["state"] == "exited" and records[i].get("lent_out"))
        for i in range(wanted)
    )


def needs_lease(row: Row, wanted: int) -> bool:
    """A replica to yield (awake past the `wanted` ones) or to wake (asleep within them)."""
    return any(
        (r["index"] >= wanted and r["state"] == "ready")
        or (r["index"] < wanted and r["state"] == "asleep")
        for r in row["replicas"]
    )
