"""Tidal sharing live: idle replicas lend their devices to elastic jobs and take them back.

The scheduler decides (`argosy.scheduler.elastic`: a tidal service's replica target
follows its forecast; an elastic job grows into what the replicas gave up and is shrunk
when they need it back); `Lease` carries the decisions out on the real processes:

  yield     a replica the scheduler dropped is put to sleep (`POST /admin/sleep`): its
            device is lent. Replica states: ready -> yielding -> asleep.
  resize    an elastic job whose placement changed is stopped (SIGTERM: it checkpoints
            and exits) and, once its old ranks are gone and no awake replica holds a
            device of its new placement, started again at the new size in the same run
            directory, where it resumes from its checkpoint.
  reclaim   a replica placed again is woken (`POST /admin/wake`) once no training rank
            holds its device, and must answer one token before it counts as ready.
            Replica states: asleep -> waking -> ready.

The invariant it keeps: a device is never held by an awake replica and a training rank
at once. A replica holds its device while starting, ready, yielding or waking; a job
holds the devices of its attempt's placement from its start until its exit is polled.

Each transition is an event on the service or job, with its durations: `yield` (sleep
seconds, resident memory before and after), `reclaim` (wake + first token), `resize`
(asked) and `resized` (stop, wait, restart, restore seconds; the step resumed from and
whether memory or disk held it; steps lost). `counts` and `seconds` feed `/metrics`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from argosy.core.errors import ArgosyError
from argosy.server.job_json import loads_job_json
from argosy.server.replica_probe import PROVEN, UNPROVEN, probe_health, replica_proof_key
from argosy.server.store import Row, Store

HOLDING = frozenset({"starting", "ready", "yielding", "waking"})
"""Replica states in which the replica holds its device."""
RESIZE_GRACE_S = 60.0
"""Seconds an elastic job's ranks get between SIGTERM and SIGKILL (`argosy launch`'s
`runtime.term_grace_s`): a resize stops them, and they save a checkpoint first."""
GRACE_ENV = "ARGOSY__RUNTIME__TERM_GRACE_S"
RESUME_WAIT_S = 900.0
"""How long a relaunched job is watched for its first step before `resized` is
recorded without one."""


class ReplicaAdmin(Protocol):
    """How the lease talks to a replica (`argosy serve`'s admin routes)."""

    def prove(self, url: str, key: bytes, where: str) -> None:
        """Return only when the process at `url` proves it is the replica started to
        listen on `where` under `key` (`replica_probe`): what holds a replica's port is
        sent its admin token only then. Raises ArgosyError otherwise."""
        ...

    def sleep(self, url: str, token: str, level: int) -> dict[str, Any]:
        """Put the replica to sleep; its JSON answer (`seconds`, `resident_bytes`, ...)."""
        ...

    def wake(self, url: str, token: str) -> dict[str, Any]:
        """Wake the replica; its JSON answer."""
        ...

    def first_token(self, url: str, model: str, api_key: str) -> float:
        """Seconds until the replica answers a one-token chat request (with its key)."""
        ...


class HttpReplicaAdmin:
    """`ReplicaAdmin` over HTTP."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def sleep(self, url: str, token: str, level: int) -> dict[str, Any]:
        return self._post(f"{url}/admin/sleep", {"level": level}, token)

    def wake(self, url: str, token: str) -> dict[str, Any]:
        return self._post(f"{url}/admin/wake", {}, token)

    def prove(self, url: str, key: bytes, where: str) -> None:
        found = probe_health(f"{url}/live", key, where)
        if found != PROVEN:
            why = "answered without the replica's proof" if found == UNPROVEN else "is down"
            raise ArgosyError(f"{where} {why}: its admin token was not sent")

    def first_token(self, url: str, model: str, api_key: str) -> float:
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
        start = time.perf_counter()
        self._post(f"{url}/v1/chat/completions", body, api_key)
        return time.perf_counter() - start

    def _post(self, url: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        request = urllib.request.Request(  # noqa: S310  # the replica's own http URL
            url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            return json.loads(response.read() or b"{}")


def replica_token(secret: bytes, service_id: str) -> str:
    """The admin token of a service's replicas: derived from the server's secret, so a
    restarted server can still reach the replicas it adopts."""
    return hmac.new(secret, service_id.encode(), hashlib.sha256).hexdigest()


def service_api_key(secret: bytes, service_id: str) -> str:
    """The API key of a service's `/v1/*` routes (`argosy.serving.api_key`): derived from
    the server's secret with another label than the admin token, so neither gives the
    other; only the service's queue and admins can read it (`GET .../services/{id}/key`)."""
    digest = hmac.new(secret, b"api-key\0" + service_id.encode(), hashlib.sha256).hexdigest()
    return "sk-argosy-" + digest


@dataclass
class Resize:
    """One resize of an elastic job, from the decision to the first step after it."""

    before: int
    after: int
    asked_s: float
    last_step: int | None = None
    stopped_s: float | None = None
    launched_s: float | None = None
    launched_wall: float = 0.0
    gained: dict[str, str] = field(default_factory=dict)
    """Nodes the job grows onto -> the service whose replica lent it."""


@dataclass
class ReplicaCall:
    """A sleep or wake request in flight."""

    kind: str  # "yield" | "reclaim"
    service_id: str
    index: int
    future: Future[dict[str, Any]]


class Lease:
    """Carries out the scheduler's tidal decisions; called from the control loop."""

    def __init__(self, store: Store, admin: ReplicaAdmin, secret: bytes) -> None:
        self.store = store
        self.admin = admin
        self.secret = secret
        self.resizes: dict[str, Resize] = {}
        self.calls: dict[str, ReplicaCall] = {}  # replica key -> call in flight
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lease")

    def token(self, service_id: str) -> str:
        return replica_token(self.secret, service_id)

    def api_key(self, service_id: str) -> str:
        return service_api_key(self.secret, service_id)

    # ---- replicas ---------------------------------------------------------------------
    def reconcile(
        self, row: Row, wanted: list[str], model: str, take_back: Callable[[str, str], bool]
    ) -> bool:
        """Yield the replicas of a tidal service beyond the scheduler's `wanted` nodes and
        wake the asleep ones it placed again once they have their device back
        (`take_back(key, node)`: False while another attempt, training ranks that still stop
        included, holds it); returns whether a record changed."""
        changed = False
        for rec in row["replicas"]:
            key = f"{row['id']}.r{rec['index']}"
            if key in self.calls:
                continue
            if rec["index"] >= len(wanted) and rec["state"] == "ready":
                self._call(key, "yield", row, rec, self._sleep_level(row))
                changed = True
            elif rec["index"] < len(wanted) and rec["state"] == "asleep":
                node = wanted[rec["index"]]
                if not take_back(key, node):
                    continue  # its device is still another's
                rec["node"] = node
                self._call(key, "reclaim", row, rec, model)
                changed = True
        return changed

    def _sleep_level(self, row: Row) -> int:
        return int((row["spec"].get("tidal") or {}).get("sleep_level", 2))

    def _call(self, key: str, kind: str, row: Row, rec: dict[str, Any], arg: Any) -> None:
        where = f"{rec['address']}:{rec['port']}"
        url, token = f"http://{where}", self.token(row["id"])
        proof = (self.admin, url, replica_proof_key(self.secret, row["id"]), where)
        if kind == "yield":
            rec["state"] = "yielding"
            future = self._pool.submit(_proven, proof, _timed, self.admin.sleep, url, token, arg)
        else:
            rec["state"] = "waking"
            api_key = self.api_key(row["id"])
            call = (_wake_to_token, self.admin, url, token, arg, api_key)
            future = self._pool.submit(_proven, proof, *call)
        self.calls[key] = ReplicaCall(kind, row["id"], rec["index"], future)

    def collect(self, rows: dict[str, Row], stop: Callable[[str], None]) -> set[str]:
        """Apply the sleep and wake calls that finished; a replica whose call failed is
        stopped (an exited replica holds nothing, and is started afresh when wanted).
        Returns the services whose records changed."""
        changed: set[str] = set()
        for key, call in list(self.calls.items()):
            if not call.future.done():
                continue
            del self.calls[key]
            row = rows.get(call.service_id)
            rec = replica_record(row, call.index)
            if row is None or rec is None:
                continue
            changed.add(call.service_id)
            try:
                answer = call.future.result()
            except (OSError, ValueError) as err:
                self.store.add_event(
                    call.service_id, f"{call.kind}_failed", f"replica {call.index}: {err}"
                )
                stop(key)
                continue
            self._done(call, rec, answer)
        return changed

    def _done(self, call: ReplicaCall, rec: dict[str, Any], answer: dict[str, Any]) -> None:
        i, node = call.index, rec["node"]
        if call.kind == "yield":
            rec["state"] = "asleep"
            seconds = float(answer["wall_s"])
            before = answer.get("resident_bytes_before", 0) / 1e6
            after = answer.get("resident_bytes", 0) / 1e6
            what = f"replica {i} yielded {node}: asleep in {seconds:.2f} s"
            what += f" (level {answer.get('level')}, resident {before:.0f} -> {after:.0f} MB)"
        else:
            rec["state"] = "ready"
            wake_s, token_s = float(answer["wall_s"]), float(answer["first_token_s"])
            seconds = wake_s + token_s
            what = f"replica {i} reclaimed {node}: wake {wake_s:.2f} s + first token "
            what += f"{token_s:.2f} s = {seconds:.2f} s"
        self.counts[call.kind] += 1
        self.seconds[call.kind] += seconds
        self.store.add_event(call.service_id, call.kind, what)

    # ---- elastic jobs -----------------------------------------------------------------
    def resize(
        self, row: Row, before: int, after: int, reason: str, lenders: dict[str, str]
    ) -> bool:
        """The scheduler resized a running job: ask its attempt to stop (it checkpoints);
        returns whether the attempt must be stopped now."""
        job_id = row["id"]
        verb = "grow" if after > before else "shrink"
        current = self.resizes.get(job_id)
        if current is not None and current.launched_s is not None:  # the last one is done
            del self.resizes[job_id]
            self._record_resized(job_id, current, None, before)
            current = None
        if current is not None:  # resized again before the relaunch: the newest size wins
            current.after = after
            current.gained.update(lenders)
            self.store.add_event(job_id, "resize", f"{verb} to {after} devices ({reason})")
            return False
        self.resizes[job_id] = Resize(before, after, time.monotonic(), gained=dict(lenders))
        what = f"{verb} {before} -> {after} devices ({reason}); stopping attempt "
        what += f"{row['attempts']} so it checkpoints"
        self.store.update_job(job_id, {"stop_requested": "resize"}, event=("resize", what))
        return True

    def stopped(self, job_id: str, run_dir: Path) -> None:
        """The attempt stopped for a resize: note when and at which step."""
        r = self.resizes.get(job_id)
        if r is None:
            r = self.resizes[job_id] = Resize(0, 0, time.monotonic())
        r.stopped_s = time.monotonic()
        r.last_step = _last_step(run_dir)

    def waiting(self, job_id: str) -> bool:
        """The job's attempt stopped for a resize and the new one has not started."""
        r = self.resizes.get(job_id)
        return r is not None and r.stopped_s is not None and r.launched_s is None

    def ready_to_relaunch(self, job_id: str, busy: bool) -> bool:
        """Whether the job may start again: its old ranks are gone and its new devices
        are not `busy` (held by an awake replica or an attempt still stopping)."""
        return self.waiting(job_id) and not busy

    def launched(self, job_id: str) -> None:
        r = self.resizes[job_id]
        r.launched_s, r.launched_wall = time.monotonic(), time.time()

    def forget(self, job_id: str) -> None:
        self.resizes.pop(job_id, None)

    def watch(self, run_dirs: Callable[[str], Path], devices: Callable[[str], int]) -> None:
        """Record `resized` for the relaunched jobs whose new attempt took its first step
        (or that were watched for `RESUME_WAIT_S` without one)."""
        for job_id, r in list(self.resizes.items()):
            if r.launched_s is None:
                continue
            resumed = _resume_times(run_dirs(job_id), r.launched_wall)
            waited = time.monotonic() - r.launched_s
            if resumed is None and waited < RESUME_WAIT_S:
                continue
            del self.resizes[job_id]
            self._record_resized(job_id, r, resumed, devices(job_id))

    def _record_resized(
        self, job_id: str, r: Resize, resumed: dict[str, Any] | None, devices: int
    ) -> None:
        stop_s = (r.stopped_s or r.asked_s) - r.asked_s
        wait_s = (r.launched_s or 0.0) - (r.stopped_s or r.asked_s)
        what = f"now {devices} devices; stop {stop_s:.2f} s, wait {wait_s:.2f} s"
        if resumed is None:
            what += "; the new attempt took no step yet"
        else:
            restart_s, restore_s = resumed["restart_s"], resumed["restore_s"]
            what += f", restart {restart_s:.2f} s, restore {restore_s:.2f} s"
            what += f", first step {resumed['first_step_s']:.2f} s; resumed at step "
            what += f"{resumed['step']} from {resumed['source']}"
            if resumed["source"] == "disk":
                what += " (memory snapshots end with the stopped launcher)"
            if r.last_step is not None:
                what += f"; {max(0, r.last_step - resumed['step'])} step(s) lost"
            self.seconds["resize_restart"] += restart_s + restore_s
        if r.gained:
            lent = ", ".join(f"{n} (lent by {s})" for n, s in sorted(r.gained.items()))
            what += f"; grew onto {lent}"
        self.counts["resize"] += 1
        self.seconds["resize_stop"] += stop_s
        self.store.add_event(job_id, "resized", what)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def replica_record(row: Row | None, index: int) -> dict[str, Any] | None:
    """The record of replica `index` in a service row (None: no row, or no such replica)."""
    if row is None:
        return None
    return next((r for r in row["replicas"] if r["index"] == index), None)


def _timed(call: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    start = time.perf_counter()
    answer = dict(call(*args))
    return answer | {"wall_s": time.perf_counter() - start}


def _proven(proof: tuple[ReplicaAdmin, str, bytes, str], call: Callable, *args: Any) -> Any:
    """`call(*args)` once the replica proved itself (`ReplicaAdmin.prove`)."""
    admin, url, key, where = proof
    admin.prove(url, key, where)
    return call(*args)


def _wake_to_token(
    admin: ReplicaAdmin, url: str, token: str, model: str, api_key: str
) -> dict[str, Any]:
    answer = _timed(admin.wake, url, token)
    return answer | {"first_token_s": admin.first_token(url, model, api_key)}


EVENTS_LIMIT_BYTES = 64 << 20
"""The most of a job's events.jsonl the lease reads."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """The job's runtime events, read as a file the job wrote (`read_job_text`): lines
    that are not strict JSON objects (`loads_job_json`) are skipped, and a `step` is kept
    only as a whole number."""
    from argosy.core.confined import read_job_text

    text = read_job_text(run_dir / "events.jsonl", limit=EVENTS_LIMIT_BYTES)
    events = []
    for line in (text or "").splitlines():
        try:
            record = loads_job_json(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("event"), str):
            continue
        if "step" in record and not _whole(record["step"]):
            record.pop("step")
        events.append(record)
    return events


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _last_step(run_dir: Path) -> int | None:
    """The newest step the stopped attempt's ranks finished."""
    steps = [e["step"] for e in _events(run_dir) if e["event"] == "step" and "step" in e]
    return max(steps, default=None)


def _resume_times(run_dir: Path, launched_wall: float) -> dict[str, Any] | None:
    """From the relaunched run's events: seconds to the ranks attaching (restart), to the
    agreed restore, to the first step after it; None until that step is there."""
    events = [e for e in _events(run_dir) if _wall(e) >= launched_wall - 1.0]
    attached = next((e for e in events if e["event"] == "attached"), None)
    resume = next((e for e in events if e["event"] == "resume"), None)
    if attached is None or resume is None:
        return None
    step = resume.get("step") or 0
    first = next((e for e in events if e["event"] == "step" and e.get("step", 0) > step), None)
    if first is None:
        return None
    decision = resume.get("decision") or {}
    return {
        "restart_s": _wall(attached) - launched_wall,
        "restore_s": _wall(resume) - _wall(attached),
        "first_step_s": _wall(first) - _wall(resume),
        "step": step,
        "source": (decision.get("source") if isinstance(decision, dict) else None) or "none",
    }


def _wall(event: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(event.get("wall"))).timestamp()
    except (ValueError, OverflowError, OSError):
        return 0.0
