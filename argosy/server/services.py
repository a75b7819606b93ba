"""Services on the control loop: replicas placed by the scheduler, run, probed, restarted.

A service is one scheduler workload of kind `infer` (one device per replica). When the
scheduler places or moves replicas (a `replicas` decision), `Services.placed` starts the
missing ones through the executor as `argosy serve --model M --host H --port P ...`
processes, each an executor attempt keyed `<service id>.r<i>`. `step` probes every
started replica's liveness route `/live` from a thread pool (the event loop never waits
on a replica), and `apply_exit` restarts a replica that exited (up to `max_restarts`, then
the service fails; a replica that fails before it is ready twice in a row with the same
error line from its launcher is not restarted again: the service fails with that line).
A replica that was ready and then fails `UNHEALTHY_AFTER` probes in a row is stopped,
and so restarted.

A probe proves who answers: each one sends a fresh nonce (`/live?nonce=N`) and a replica
is ready only when the answer carries the HMAC of N and the replica's `host:port` under
its service's proof key (`replica_proof_key`, derived from the server's secret, handed to
the replica in its environment, never sent). Another process that took the port first
(a tenant who saw it) answers without the proof: the replica stays `starting` (and the
real one fails to bind that port and exits, naming it); one whose port answers only so
for `UNPROVEN_GRACE_S` is stopped, and a second attempt ending that way fails the
service. For a ready replica such an answer is a failed probe.

States: pending (no replica placed) -> starting (placed, not all ready) -> running (all
ready); stopping (deleted or failed, replicas stopping) -> deleted | failed. Replica
records (node, port, attempt, restarts, state) live in the store, so a restarted server
adopts replicas that still run.

A service with a `tidal` forecast has as many replicas awake as the scheduler places
(its forecast); the others sleep with their devices lent (`argosy.server.tidal.Lease`
yields and reclaims them, and a tidal replica starts with the admin token the lease uses).
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.executors.base import AttemptExit, Executor, LaunchRequest
from argosy.server.failures import error_clause
from argosy.server.field_errors import RefusedError
from argosy.server.replica_probe import (
    DOWN,
    PROVEN,
    UNPROVEN,
    probe_health,
    replica_proof_key,
)
from argosy.server.scheduling import Scheduling
from argosy.server.service_spec import ServiceSpec
from argosy.server.store import SYSTEM_ACTOR, Row, Store
from argosy.server.tidal import HOLDING, Lease
from argosy.server.tidal_replicas import STOPS_NOT_COUNTED, TidalReplicas, replica_key
from argosy.server.views import public_launcher_error
from argosy.serving.admin import PROOF_KEY_ENV
from argosy.serving.api_key import ENV_API_KEY

SERVICE_TERMINAL: frozenset[str] = frozenset({"deleted", "failed"})
UNHEALTHY_AFTER = 3
"""Failed probes in a row after which a ready replica is restarted."""
UNPROVEN_GRACE_S = 30.0
"""Seconds a starting replica's port may answer without the replica's proof before the
replica is stopped (its process cannot hold the port: another one does)."""


def is_replica(key: str) -> bool:
    return key.startswith("s") and ".r" in key


class Services(TidalReplicas):
    """The services part of the control loop (its tidal part: `TidalReplicas`)."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        scheduling: Scheduling,
        runs_dir: Path,
        lease: Lease,
        probe: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        self.executor = executor
        self.scheduling = scheduling
        self.runs_dir = runs_dir
        self.lease = lease
        self.probe = probe
        """A stand-in for `probe_health` (tests): URL -> whether the replica answers;
        None: `probe_health`, which checks the replica's proof."""
        self.health_interval_s = 1.0
        self.unproven_grace_s = UNPROVEN_GRACE_S
        self.active: dict[str, Row] = {}  # service id -> row (replicas: list of dicts)
        self._probes: dict[str, Future[bool | str]] = {}  # replica key -> probe in flight
        self._failures: dict[str, int] = {}
        self._unproven: dict[str, float] = {}  # replica key -> first answer without proof
        self._stop_reasons: dict[str, str] = {}  # replica key -> why we stopped it
        self._taken_since: dict[str, float] = {}  # asleep replica key -> first refused take-back
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="probe")
        self._last_probe_s = 0.0

    # ---- requests --------------------------------------------------------------------
    def submit(self, spec: ServiceSpec, now: float, *, actor: str = SYSTEM_ACTOR) -> Row:
        field, reason = self.scheduling.check_service(spec)
        if reason:
            raise RefusedError(reason, field)
        row = self.store.insert_service(spec.model_dump(), now=now, actor=actor)
        reason = self.scheduling.submit_service(row["id"], spec, now)
        if reason:
            values = {"state": "failed", "reason": reason}
            self.store.update_service(row["id"], values, event=("failed", reason), actor=actor)
            return self.store.get_service(row["id"]) or row
        self.active[row["id"]] = row
        return row

    def delete(self, service_id: str, *, actor: str = SYSTEM_ACTOR) -> None:
        row = self.active.get(service_id)
        if row is None:
            return
        self._stop_all(row, "delete", "deleted by request", actor)

    # ---- start-up --------------------------------------------------------------------
    def recover(self) -> None:
        """Adopt the replicas that still run; the others start again (once every
        service's replicas are handed over: none starts on another's device)."""
        for row in self.store.list_services(
            states=["pending", "starting", "running", "stopping"], limit=10**6
        )[0]:
            yielding = {r["index"] for r in row["replicas"] if r["state"] == "yielding"}
            for rec in row["replicas"]:
                rec["state"] = AFTER_RESTART.get(rec["state"], rec["state"])
                if rec["state"] in (*HOLDING, "asleep") and rec["attempt"] > 0:
                    key = replica_key(row["id"], rec["index"])
                    if self.executor.adopt(key, rec["attempt"], self.run_dir(key)) is not None:
                        # restarts on its node below; an asleep one's device was lent
                        rec["waiting"] = rec["state"] != "asleep"
                        rec["state"] = "exited"
            self.hand_over(row, self.scheduling, lent=yielding)
            self.active[row["id"]] = row
        for row in list(self.active.values()):  # once every service has its devices back
            if row["stop_requested"]:
                self._stop_all(row, row["stop_requested"], row["reason"])
            else:
                self.placed(row["id"])

    def hand_over(self, row: Row, scheduling: Scheduling, lent: set[int] | None = None) -> None:
        """Give a (new) scheduler the service with its replicas where they are placed
        (`lent`: replicas that were yielding, whose devices the scheduler gave back)."""
        spec = ServiceSpec.model_validate(row["spec"])
        records = {r["index"]: r for r in row["replicas"]}
        # slot i is replica i's, on its node where it held one (`_held_slot`)
        nodes = [
            r.get("node") if r is not None and _held_slot(r, lent or set()) else None
            for r in (records.get(i) for i in range(max(records, default=-1) + 1))
        ]
        scheduling.adopt_service(row["id"], spec, row["created_at"], nodes)

    def rebuild(self, scheduling: Scheduling) -> None:
        """The control loop replaced its scheduler (nodes joined): hand every live
        service over, then use the new one."""
        for row in self.active.values():
            self.hand_over(row, scheduling)
        self.scheduling = scheduling

    # ---- placement -------------------------------------------------------------------
    def placed(self, service_id: str) -> None:
        """Make the running replicas match the scheduler's placement."""
        row = self.active.get(service_id)
        if row is None or row["stop_requested"]:
            return
        spec = ServiceSpec.model_validate(row["spec"])
        nodes = self.scheduling.replica_nodes(service_id)
        records = {r["index"]: r for r in row["replicas"]}
        room = self._room()
        for i, node in enumerate(nodes):
            rec = records.get(i) or _new_record(i)
            records[i] = rec
            if rec.get("state") in ("asleep", "yielding", "waking"):
                continue  # the lease wakes it (on this node) once the node is free
            if rec.get("node") != node and rec.get("state") in ("starting", "ready"):
                self.executor.stop(replica_key(service_id, i))  # moved: restarts there
                rec["node"] = node
            elif rec.get("state") not in ("starting", "ready"):
                moved = self._in_service(service_id, i, node)
                if moved != node:  # a device the scheduler just gave: count it afresh
                    node, room = moved, self._room()
                rec["node"] = node
                out = node in self.scheduling.out_of_service  # no device elsewhere yet
                rec["waiting"] = out or room.get(node, 1) <= 0  # started once one is free
                if not rec["waiting"]:
                    room[node] = room.get(node, 1) - 1
                    self._start(service_id, spec, rec)
        for rec in records.values():  # a replica beyond the scheduler's slots holds no device
            if rec["index"] < len(nodes):
                continue
            rec["waiting"] = False  # nor waits for one (a restart gives it no slot)
            if spec.tidal is None and rec["state"] in ("starting", "ready"):
                self.executor.stop(replica_key(service_id, rec["index"]))
        row["replicas"] = [records[i] for i in sorted(records)]
        self._save(row)

    def _start(self, service_id: str, spec: ServiceSpec, rec: dict[str, Any]) -> None:
        if self.executor.devices_busy({rec["node"]: 1}):
            rec["waiting"] = True  # its device is still another's: started once free
            return
        key = replica_key(service_id, rec["index"])
        info = next(n for n in self.scheduling.nodes if n.name == rec["node"])
        address = info.address or "127.0.0.1"
        port = rec["port"] or (spec.port + rec["index"] if spec.port else _free_port(address))
        rec |= {"attempt": rec["attempt"] + 1, "port": port, "address": address}
        request = LaunchRequest(
            job_id=key,
            attempt=rec["attempt"],
            script="",
            args=(),
            nproc_per_node=1,
            run_dir=self.run_dir(key),
            nodes={rec["node"]: 1},
            chip=info.chip,
            env=self._replica_env(service_id, spec),
            command=tuple(serve_command(spec, address, port)),
            queue=spec.queue,
        )
        try:
            self.executor.start(request)
        except (OSError, ArgosyError) as err:
            rec["state"] = "exited"
            self.store.add_event(service_id, "replica_failed", f"replica {rec['index']}: {err}")
            return
        rec |= {"state": "starting", "started_at": time.time(), "lent_out": False}
        self._failures.pop(key, None)
        self._unproven.pop(key, None)
        self._stop_reasons.pop(key, None)
        where = f"{rec['node']} port {port}"
        if seen := self.executor.devices_of(key):
            where += f" ({seen})"
        self.store.add_event(service_id, "replica_started", f"replica {rec['index']} on {where}")

    def _replica_env(self, service_id: str, spec: ServiceSpec) -> dict[str, str]:
        # the key in the environment, not the command line every user can read
        env = {"ARGOSY_SERVICE_ID": service_id, ENV_API_KEY: self.lease.api_key(service_id)}
        env[PROOF_KEY_ENV] = self.proof_key(service_id).decode()
        if spec.tidal is not None:  # the lease sleeps and wakes it
            env["ARGOSY_ADMIN_TOKEN"] = self.lease.token(service_id)
        return env

    # ---- exits and probes ------------------------------------------------------------
    def apply_exit(self, e: AttemptExit) -> None:
        row, rec = self._replica(e.job_id)
        if row is None or rec is None or rec["attempt"] != e.attempt:
            return
        service_id = row["id"]
        before_ready = rec["state"] == "starting"
        rec["state"] = "exited"
        stopped_why = self._stop_reasons.pop(e.job_id, "")
        error = stopped_why or public_launcher_error(self.run_dir(e.job_id), e.attempt)
        message = f"replica {rec['index']} attempt {e.attempt}: {e.reason}"
        message += error_clause(error)
        if row["stop_requested"]:
            self.store.add_event(service_id, "replica_stopped", message)
            self._finish_if_stopped(row)
            return
        if e.lost_node_ranks or rec.get("node") in self.scheduling.out_of_service:
            message += "; its node is out of service"  # not the replica's failure
        elif stopped_why not in STOPS_NOT_COUNTED:
            rec["restarts"] += 1
        spec = ServiceSpec.model_validate(row["spec"])
        counts = before_ready and (e.exit_code or stopped_why)
        if _fails_again(rec, error if counts else ""):
            why = f"{message}; failed the same way twice in a row before it was ready"
            self._stop_all(row, "fail", why)
            return
        if rec["restarts"] > spec.max_restarts:
            why = f"{message}; max_restarts={spec.max_restarts} used up"
            self._stop_all(row, "fail", why)
            return
        nodes = self.scheduling.replica_nodes(service_id)
        if rec["index"] >= len(nodes):  # not wanted awake now: started again when it is
            rec["waiting"] = False  # it holds no slot
            rec["lent_out"] = True  # started when the scheduler places it again
            self.store.add_event(service_id, "replica_exited", message + "; its device is lent")
        else:
            self.store.add_event(service_id, "replica_exited", message + "; restarting")
            rec["node"] = self._in_service(service_id, rec["index"], nodes[rec["index"]])
            out = rec["node"] in self.scheduling.out_of_service  # no device elsewhere yet
            rec["waiting"] = out or self._room().get(rec["node"], 1) <= 0
            if not rec["waiting"]:  # else: started once its device is free
                self._start(service_id, spec, rec)
        self._save(row)

    def step(self, now_s: float) -> None:
        """Collect finished probes and lease calls; yield and wake tidal replicas; start
        new probes every `health_interval_s`."""
        for service_id in self.lease.collect(self.active, self.executor.stop):
            self._save(self.active[service_id])
        self._reconcile_tidal()
        for key, probe in list(self._probes.items()):
            if probe.done():
                del self._probes[key]
                self._apply_probe(key, probe.result())
        if now_s - self._last_probe_s < self.health_interval_s:
            return
        self._last_probe_s = now_s
        for service_id, row in self.active.items():
            for rec in row["replicas"]:
                key = replica_key(service_id, rec["index"])
                if rec["state"] in ("starting", "ready") and key not in self._probes:
                    self._probes[key] = self._submit_probe(service_id, rec)

    def _submit_probe(self, service_id: str, rec: dict[str, Any]) -> Future[bool | str]:
        # liveness, not readiness: `/health` is a 503 while the replica sleeps, and a
        # busy or sleeping replica must not be restarted
        where = f"{rec['address']}:{rec['port']}"
        url = f"http://{where}/live"
        if self.probe is not None:
            return self._pool.submit(self.probe, url)
        return self._pool.submit(probe_health, url, self.proof_key(service_id), where)

    def proof_key(self, service_id: str) -> bytes:
        return replica_proof_key(self.lease.secret, service_id)

    def _in_service(self, service_id: str, index: int, node: str) -> str:
        """The node replica `index` (not running) starts on: its slot's, or, that node
        being out of service (cordoned, lost), a device the scheduler moves it to."""
        if node not in self.scheduling.out_of_service:
            return node
        return self.scheduling.move_replica(service_id, index) or node

    def _room(self) -> dict[str, int]:
        """Devices a replica may start on now, per node the scheduler placed replicas on:
        what it counts free there plus its replica slots, less the replicas (of any
        service) that hold a device there now (a yielding replica holds one the scheduler
        has given out again until it is asleep). Where the executor has no device free
        there yet (ranks that stop for a resize or a preemption hold theirs until they are
        gone), `_start` leaves the replica waiting."""
        slots = self._slots()
        held = self._holding_less_slots(slots)
        return {n: self.scheduling.free_on(n) - held[n] for n in slots}

    def held_beyond_slots(self) -> dict[str, int]:
        """Per node, replicas that hold a device there (starting, ready, yielding or
        waking) beyond the replica slots the scheduler keeps there: devices it has
        already given out again (a tidal service shrunk: its replica holds the device
        until it is asleep)."""
        return {n: k for n, k in self._holding_less_slots(self._slots()).items() if k > 0}

    def _slots(self) -> dict[str, int]:
        """Replica slots the scheduler keeps per node, over every service."""
        slots: dict[str, int] = {}
        for service_id in self.active:
            for node in self.scheduling.replica_nodes(service_id):
                slots[node] = slots.get(node, 0) + 1
        return slots

    def _holding_less_slots(self, slots: dict[str, int]) -> dict[str, int]:
        """Per node (of a slot or a holding replica), replicas holding a device there
        less the slots there."""
        count = {n: -k for n, k in slots.items()}
        for row in self.active.values():
            for r in row["replicas"]:
                if r["state"] in HOLDING and r.get("node"):
                    count[r["node"]] = count.get(r["node"], 0) + 1
        return count

    def lender(self, node: str) -> str:
        """The service whose asleep replica's device `node` is ("" if none)."""
        for service_id, row in self.active.items():
            if any(r["state"] == "asleep" and r.get("node") == node for r in row["replicas"]):
                return service_id
        return ""

    def _apply_probe(self, key: str, result: bool | str) -> None:
        row, rec = self._replica(key)
        if row is None or rec is None or row["stop_requested"]:
            return
        service_id, index = row["id"], rec["index"]
        outcome = result if isinstance(result, str) else PROVEN if result else DOWN
        if outcome == UNPROVEN and rec["state"] == "starting":
            self._unproven_answer(row, rec, key)
            return
        if outcome == PROVEN:
            self._unproven.pop(key, None)
            if self._failures.pop(key, None):  # a failed probe is shown until one passes
                rec["failed_probes"] = 0
                self._save(row)
            if rec["state"] == "starting":
                rec["state"] = "ready"
                self.store.add_event(service_id, "replica_ready", f"replica {index} healthy")
                self._save(row)
            return
        if rec["state"] != "ready":
            return  # still loading its model
        self._failures[key] = failures = self._failures.get(key, 0) + 1
        rec["failed_probes"] = failures
        self._save(row)
        if failures == 1:
            how = " (its port answered without the replica's proof)" if outcome == UNPROVEN else ""
            msg = f"replica {index} failed a health probe{how}; "
            msg += f"{UNHEALTHY_AFTER} in a row restart it"
            self.store.add_event(service_id, "replica_probe_failed", msg)
        if failures == UNHEALTHY_AFTER:
            why = f"replica {index} failed {failures} health probes in a row; restarting it"
            self.store.add_event(service_id, "replica_unhealthy", why)
            self.executor.stop(key)

    def _unproven_answer(self, row: Row, rec: dict[str, Any], key: str) -> None:
        """A starting replica's port answered 200 without the replica's proof: not ready;
        past `unproven_grace_s` the replica is stopped (its exit counts as a failure
        before ready, with this reason)."""
        now = time.monotonic()
        where = f"port {rec['port']} on {rec['node']}"
        why = f"{where} answered without the replica's proof: another process holds it"
        if key not in self._unproven:
            self._unproven[key] = now
            msg = f"replica {rec['index']}: {why}; not ready"
            self.store.add_event(row["id"], "replica_unproven", msg)
        if now - self._unproven[key] >= self.unproven_grace_s and key not in self._stop_reasons:
            self._stop_reasons[key] = why
            grace = f"{self.unproven_grace_s:g} s"
            msg = f"replica {rec['index']}: {why} for {grace}; stopping it"
            self.store.add_event(row["id"], "replica_unproven", msg)
            self.executor.stop(key)

    # ---- state -----------------------------------------------------------------------
    def _stop_all(self, row: Row, why: str, reason: str, actor: str = SYSTEM_ACTOR) -> None:
        row["stop_requested"], row["reason"] = why, reason
        kind = "failed" if why == "fail" else "delete"
        self.store.update_service(
            row["id"], {"stop_requested": why, "reason": reason}, event=(kind, reason), actor=actor
        )
        for rec in row["replicas"]:
            if rec["state"] in (*HOLDING, "asleep"):
                self.executor.stop(replica_key(row["id"], rec["index"]))
        self._finish_if_stopped(row, actor)

    def _finish_if_stopped(self, row: Row, actor: str | None = None) -> None:
        """Settle a stopping service once no replica holds a device; the final event
        names who deleted it (`actor`, else the actor of its `delete` event)."""
        if any(r["state"] in (*HOLDING, "asleep") for r in row["replicas"]):
            self._save(row)
            return
        if actor is None:
            deleted = row["stop_requested"] == "delete"
            actor = self.store.last_actor(row["id"], "delete") if deleted else SYSTEM_ACTOR
        self.scheduling.remove_service(row["id"])
        del self.active[row["id"]]
        state = "failed" if row["stop_requested"] == "fail" else "deleted"
        row["state"] = state
        values = {"state": state, "replicas": row["replicas"], "reason": row["reason"]}
        event = (state, row["reason"] or state)
        self.store.update_service(row["id"], values, event=event, actor=actor)

    def _save(self, row: Row) -> None:
        """Write the replicas and the state they add up to."""
        wanted = ServiceSpec.model_validate(row["spec"]).replicas
        if row["spec"].get("tidal"):
            wanted = len(self.scheduling.replica_nodes(row["id"]))
        row["state"] = _state_of(row, wanted)
        values = {"state": row["state"], "replicas": [dict(r) for r in row["replicas"]]}
        self.store.update_service(row["id"], values)

    def run_dir(self, key: str) -> Path:
        service_id, _, index = key.rpartition(".r")
        return self.runs_dir / service_id / f"r{index}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.lease.close()


AFTER_RESTART = {"yielding": "ready", "waking": "asleep"}
"""A sleep or wake call cut off by a server restart is made again (both are idempotent)."""


def _held_slot(rec: dict[str, Any], lent: set[int]) -> bool:
    """Whether the replica of `rec` held a scheduler slot: it holds its device (an
    asleep replica's is lent, as is a yielding one's in `lent`), or it is to start
    (pending or exited) and waits for its slot's device (one on a node out of service
    keeps its slot, and moves when it starts). One that exited while its device was
    lent (tidal) held none: on a node lost since, a slot there would hold no device and
    count as a replica."""
    if rec["index"] in lent or rec["state"] == "asleep":
        return False
    return rec["state"] in HOLDING or bool(rec.get("waiting"))


def _new_record(index: int) -> dict[str, Any]:
    return {"index": index, "attempt": 0, "restarts": 0, "port": 0, "state": "pending"}


def _fails_again(rec: dict[str, Any], error: str) -> bool:
    """Whether this exit repeats the replica's previous one: both before it was ready,
    with the same error line (a bad flag or model that no restart can fix). `error` is
    "" for an exit that does not count (after ready, by signal, or without a line)."""
    repeated = bool(error) and rec.get("last_error") == error
    rec["last_error"] = error
    return repeated


def _state_of(row: Row, wanted: int) -> str:
    if row["stop_requested"]:
        return "stopping"
    states = [r["state"] for r in row["replicas"]]
    ready, asleep = states.count("ready"), states.count("asleep")
    if ready >= wanted and (ready or asleep):
        return "running"
    if not any(s in HOLDING for s in states) and not asleep:
        return "pending"
    return "starting"


def serve_command(spec: ServiceSpec, host: str, port: int) -> list[str]:
    """The `argosy serve` command line of one replica."""
    command = [sys.executable, "-m", "argosy", "serve", "--model", spec.model]
    command += ["--engine", spec.engine, "--speculative", spec.speculative]
    command += ["--host", host, "--port", str(port)]
    if spec.threads:
        command += ["--threads", str(spec.threads)]
    if spec.memory_fraction is not None:
        command += ["--memory-fraction", repr(spec.memory_fraction)]
    return command


def _free_port(address: str) -> int:
    """A port free on `address` now (on another machine: one free here, likely free there)."""
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError:
            s.bind(("", 0))
        return s.getsockname()[1]
