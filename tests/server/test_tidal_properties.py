"""Property test of the live tidal lease (fake executor, fake replica admin, fake clock):
random load profiles, replica counts, floors, leads and elastic ranges, run through the
real control loop (scheduler, store, lease) for two periods; after every tick:

- no device is held by an awake replica and a training rank at once;
- from `lead_s` before every rise of the forecast, the service has at least the replicas
  the forecast needs awake (ready), never fewer than `min_replicas`;
- the job runs within its elastic range, and never as two attempts at once;

also when replica processes die at random moments (awake or asleep).
"""

from __future__ import annotations

import math
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from tidal_fakes import FAST

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.spec import ElasticSpec, JobSpec
from argosy.server.store import Store
from argosy.server.tidal import HOLDING

PERIOD_S = 120.0
TWO_TROUGHS: dict[str, Any] = {
    "replicas": 2,
    "min_replicas": 0,
    "levels": [1.0, 0.0, 0.0, 0.0, 1.0, 1.0],
    "lead_s": 20.0,
    "nodes": 3,
    "job_min": 1,
    "job_max": 3,
    "crashes": set(),
}
"""Two troughs a period: yield, grow, shrink, reclaim, twice."""
TICKS_PER_STEP = 3


class FakeAdmin:
    """Replicas that sleep and wake when the test lets them (`release`); counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Semaphore(0)
        self.proofs = 0

    def sleep(self, url: str, token: str, level: int) -> dict[str, Any]:
        assert token, "a tidal replica is driven with its admin token"
        assert self.gate.acquire(timeout=10)
        self.calls.append(("sleep", url))
        return {"state": "asleep", "level": level, "seconds": 0.0, "resident_bytes": 1}

    def wake(self, url: str, token: str) -> dict[str, Any]:
        assert self.gate.acquire(timeout=10)
        self.calls.append(("wake", url))
        return {"state": "awake", "level": 0, "seconds": 0.0, "resident_bytes": 2}

    def prove(self, url: str, key: bytes, where: str) -> None:
        assert key and url.endswith(where), "a call is sent only after the replica's proof"
        self.proofs += 1

    def first_token(self, url: str, model: str, api_key: str) -> float:
        return 0.0


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    replicas = draw(st.integers(1, 3))
    job_min = draw(st.integers(1, 2))
    nodes = replicas + job_min + draw(st.integers(0, 1))
    levels = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=5, max_size=8))
    trough = draw(st.integers(0, len(levels) - 1))  # a trough of three steps or more
    for k in range(draw(st.integers(3, len(levels) - 1))):
        levels[(trough + k) % len(levels)] = 0.0
    levels[trough - 1] = 1.0  # and a peak
    step_s = PERIOD_S / len(levels)
    return {
        "replicas": replicas,
        "min_replicas": draw(st.integers(0, replicas - 1)),
        "levels": levels,
        "lead_s": draw(st.sampled_from([0.0, step_s / 2, step_s])),
        "nodes": nodes,
        "job_min": job_min,
        "job_max": draw(st.integers(job_min, nodes)),
        "crashes": draw(st.sets(st.integers(0, 2 * 3 * len(levels) - 1), max_size=3)),
    }


def _control(home: Path, fake: FakeExecutor, clock: FakeClock, admin: FakeAdmin) -> Control:
    config = ServerConfig(home=home, min_cycle_gap_s=0.0, nodes_interval_s=1e9, scheduler=FAST)
    ctl = Control(config, Store(config.database_url), fake, clock=clock, admin=admin,
                  probe=lambda url: True)  # fmt: skip
    ctl.services.health_interval_s = 0.0
    ctl.recover()
    return ctl


def _settle(ctl: Control, admin: FakeAdmin, exclusive: Callable[[], None]) -> None:
    """Steps until the lease's calls and the probes are answered and applied, and exits
    polled (no virtual time passes); a sleep or wake stays in flight for one step before
    it is let through; `exclusive` is checked after every step."""
    quiet = 0
    for i in range(80):
        ctl.poke()
        ctl.step()
        exclusive()
        calls = [c.future for c in ctl.lease.calls.values()]
        if i % 2:
            for _ in calls:
                admin.gate.release()
            for future in calls:
                future.result(timeout=10)
        for probe in list(ctl.services._probes.values()):  # noqa: SLF001
            probe.result(timeout=10)
        quiet = quiet + 1 if not calls else 0
        if quiet >= 4:  # exits, relaunches and starts take a step each
            return


def _need(s: dict[str, Any], t: float) -> int:
    """Replicas the forecast needs at some moment in [t, t + lead_s]."""
    step_s = PERIOD_S / len(s["levels"])
    first, last = int(t // step_s), int((t + s["lead_s"]) // step_s)
    peak = max(s["levels"][i % len(s["levels"])] for i in range(first, last + 1))
    return max(math.ceil(s["replicas"] * peak - 1e-9), s["min_replicas"])


def _exclusive(ctl: Control, fake: FakeExecutor, s: dict[str, Any], job_id: str) -> None:
    """No device is held by an awake replica and a training rank at once; the job runs
    within its range."""
    awake: dict[str, int] = {}
    for row in ctl.services.active.values():
        for rec in row["replicas"]:
            if rec["state"] in HOLDING:
                awake[rec["node"]] = awake.get(rec["node"], 0) + 1
    request = fake.running.get(job_id)
    ranks = request.nodes if request is not None else {}
    assert not set(awake) & set(ranks), f"replicas {awake} and ranks {ranks} share a device"
    assert all(n == 1 for n in awake.values()), f"two replicas on one device: {awake}"
    if request is not None:
        assert s["job_min"] <= sum(ranks.values()) <= s["job_max"], ranks


def _awake_enough(ctl: Control, s: dict[str, Any], t: float) -> None:
    service = next(iter(ctl.services.active.values()))
    ready = sum(r["state"] == "ready" for r in service["replicas"])
    assert ready >= _need(s, t), f"t={t}: {ready} ready, the forecast needs {_need(s, t)}"


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(s=scenarios())
@example(s=TWO_TROUGHS)
@example(  # a replica dies asleep; the other is placed again on its node, not its own
    s={
        "replicas": 2,
        "min_replicas": 0,
        "levels": [1.0, 0.0, 0.0, 0.0, 0.5],
        "lead_s": 0.0,
        "nodes": 5,
        "job_min": 2,
        "job_max": 5,
        "crashes": {3},
    }
)
def test_lease_keeps_its_invariants_over_random_days(s: dict[str, Any]) -> None:
    note(repr(s))
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeExecutor([NodeInfo(f"n{i}", "cpu", 1) for i in range(s["nodes"])])
        clock, admin = FakeClock(0.0), FakeAdmin()
        ctl = _control(Path(tmp), fake, clock, admin)
        tidal = TidalSpec(
            levels=s["levels"],
            period_s=PERIOD_S,
            lead_s=s["lead_s"],
            min_replicas=s["min_replicas"],
        )
        ctl.submit_service(ServiceSpec(name="chat", replicas=s["replicas"], tidal=tidal))
        _settle(ctl, admin, lambda: None)
        elastic = ElasticSpec(min_nnodes=s["job_min"], max_nnodes=s["job_max"])
        job = JobSpec(name="train", script="t.py", nnodes=s["job_min"], elastic=elastic)
        job_id = ctl.submit(job, None, "")[0]["id"]
        step_s = PERIOD_S / len(s["levels"])
        try:
            tick = 0
            while clock.now_s() < 2 * PERIOD_S:
                clock.advance(step_s / TICKS_PER_STEP)
                replicas = sorted(k for k in fake.running if k.startswith("s"))
                if tick in s["crashes"] and replicas:  # a replica process dies (asleep or not)
                    fake.finish(replicas[tick % len(replicas)], None)
                tick += 1
                _settle(ctl, admin, lambda: _exclusive(ctl, fake, s, job_id))
                _awake_enough(ctl, s, clock.now_s())
        finally:
            ctl.services.close()
            ctl.store.close()
        assert ctl.job(job_id)["state"] in ("running", "admitted")
        kinds = [e["kind"] for e in ctl.store.list_events(job_id=None, limit=10**4)[0]]
        event(f"resizes: {min(kinds.count('resize'), 4)}")
        event(f"yields: {min(kinds.count('yield'), 2)} elastic: {s['job_max'] > s['job_min']}")
        assert kinds.count("yield") == sum(c == "sleep" for c, _ in admin.calls)
        assert kinds.count("reclaim") == sum(c == "wake" for c, _ in admin.calls)
