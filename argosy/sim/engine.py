"""The discrete-event driver: trace arrivals, completions, faults and load steps on a
virtual clock, with the real scheduler deciding at every step.

    sim = Simulation(cluster, tree, trace.records, policies.get("argosy"), seed=0)
    report = sim.run()            # the dict of argosy.sim.metrics.report

Each job's progress is integrated exactly between events (rate = devices x the speed its
plan reaches on its chip, size and placement: `FlopsLedger.speed`; zero while stalled).
Scheduling cycles run after each batch of simultaneous events, at most once per
`cycle_interval_s`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from argosy.core.clock import FakeClock
from argosy.hardware.cluster import Cluster
from argosy.scheduler import growth, recovery
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.decisions import Decision
from argosy.scheduler.invariants import spares_short, violations
from argosy.scheduler.policies import Policy
from argosy.scheduler.queues import QueueTree
from argosy.scheduler.speed import relative_speed
from argosy.scheduler.workload import KINDS, TRAINING_KINDS, State, Workload
from argosy.sim.config import SimConfig
from argosy.sim.energy import energy_report
from argosy.sim.estimates import SimEstimator
from argosy.sim.faults import FaultModel
from argosy.sim.idle import IdleBreakdown
from argosy.sim.isolation import NodeIsolation
from argosy.sim.ledger import FlopsLedger
from argosy.sim.metrics import Accounting, report
from argosy.sim.plans import PlanCosts, state_bytes
from argosy.sim.trace import TraceRecord

COMPLETE, FAULT, REPAIR, TICK, CYCLE, REPLACE = range(6)
INFER = KINDS.index("infer")


class Job:
    """Progress of one workload."""

    __slots__ = ("w", "kind", "work", "done", "rate", "devices", "t_update", "stall_until",
                 "anchor", "version", "starts", "peak", "mfu", "scaling", "ended")  # fmt: skip

    def __init__(self, w: Workload, work: float) -> None:
        self.w, self.kind, self.work = w, KINDS.index(w.kind), work
        self.done = self.rate = self.t_update = self.stall_until = self.anchor = 0.0
        self.peak = self.mfu = self.scaling = 0.0  # FLOP/s per device, and its efficiency
        self.ended = -1.0
        self.devices = self.version = self.starts = 0


def to_workload(r: TraceRecord) -> Workload:
    low, high = r.device_range
    w = Workload(r.id, r.kind, r.queue, r.priority, tuple(r.chips), low, high, r.submit_s,
                 r.checkpoint_interval_s)  # fmt: skip
    if r.kind in TRAINING_KINDS:
        w.state_bytes = state_bytes(r.kind, high)
    if r.kind == "infer":
        w.min_devices = 1
        w.profile = np.asarray(r.load_profile, dtype=float)
        w.profile_step_s = r.profile_step_s
    return w


def _believed_faults(config: SchedulerConfig, sim: SimConfig) -> SchedulerConfig:
    """The scheduler sizes hot spares from the fault model the simulation injects, unless
    its config names a rate or repair time of its own."""
    update = {}
    if "hardware_fault_rate_per_device_hour" not in config.model_fields_set:
        rate = sim.fault_rate_per_device_hour * sim.hardware_share if sim.faults else 0.0
        update["hardware_fault_rate_per_device_hour"] = rate
    if "repair_s" not in config.model_fields_set:
        update["repair_s"] = sim.repair_s
    return config.model_copy(update=update)


class Simulation:
    """One policy over one trace on one cluster."""

    def __init__(
        self,
        cluster: Cluster,
        tree: QueueTree,
        records: list[TraceRecord],
        policy: Policy,
        *,
        seed: int = 0,
        horizon_s: float | None = None,
        config: SchedulerConfig | None = None,
        sim: SimConfig | None = None,
        progress: Callable[[float], None] | None = None,
        isolation: NodeIsolation | None = None,
    ) -> None:
        self.cfg = sim or SimConfig()
        self.clock = FakeClock()
        config = _believed_faults(config or SchedulerConfig(), self.cfg)
        self.isolation = isolation if policy.quarantine else None
        if self.isolation is not None:  # one rule decides: the given one, not the scheduler's
            policy = replace(policy, quarantine=False)
        self.sched = Scheduler(cluster, tree, policy, config, self.clock)
        self.policy = policy
        self.records = records
        last = max((r.submit_s for r in records), default=0.0)
        self.horizon = horizon_s or math.ceil((last + 1) / 86400) * 86400.0
        self.acc = Accounting(cluster.num_devices * self.horizon)
        self.heap: list[tuple] = []
        self.seq = 0
        self.jobs: dict[str, Job] = {}
        self.by_kind = np.zeros(len(KINDS))
        self.t_last = 0.0
        self.faults = FaultModel(self.sched.cap, self.cfg, seed)
        self.idle = IdleBreakdown(self.sched)
        stock = self.cfg.plans == "stock" or not policy.planner_plans
        self.ledger = FlopsLedger(cluster, self.horizon, PlanCosts(), stock=stock,
                                  serving_mfu=self.cfg.serving_mfu)  # fmt: skip
        self.held_by_service: dict[str, float] = {}  # peak FLOP/s of each service's replicas
        self.progress = progress
        self.cycle_at = -1.0
        self.cycle_queued = False
        self.cycle_wall: list[float] = []
        self.per_leaf: dict[int, int] = {}  # group -> most nodes under one leaf switch
        self.estimator: SimEstimator | None = None
        if policy.reservations:
            self.estimator = SimEstimator(self, self.cfg.estimate_error, seed)
            self.sched.estimator = self.estimator

    def push(self, t: float, code: int, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, code, payload))

    # ---- main loop --------------------------------------------------------------------
    def run(self) -> dict:
        wall = time.perf_counter()
        self.push(0.0, TICK)
        if self.cfg.faults:
            self._next_fault(0.0)
        i, n = 0, len(self.records)
        need = False
        while True:
            t_arr = self.records[i].submit_s if i < n else math.inf
            t_evt = self.heap[0][0] if self.heap else math.inf
            t = min(t_arr, t_evt)
            if t >= self.horizon:
                break
            self._account(t)
            if t_arr <= t_evt:
                need |= self._arrive(self.records[i], t)
                i += 1
            else:
                _, _, code, payload = heapq.heappop(self.heap)
                need |= self._event(code, payload, t)
            nxt = min(self.records[i].submit_s if i < n else math.inf,
                      self.heap[0][0] if self.heap else math.inf)  # fmt: skip
            if need and nxt > t:
                need = self._maybe_cycle(t)
        self._finish()
        extra = {"_pue": self.cfg.pue,
                 "cycle_ms_p99": float(np.percentile(self.cycle_wall, 99)) * 1e3
                 if self.cycle_wall else 0.0, "cycles": len(self.cycle_wall),
                 "horizon_days": self.horizon / 86400, "_ledger": self.ledger,
                 "plans": "stock" if self.ledger.stock else "planner",
                 "idle": self.idle.report(), "backfill": self._backfill_report(),
                 "energy": energy_report(self.idle.seconds, self.ledger, pue=self.cfg.pue,
                                         idle_fraction=self.cfg.idle_power_fraction)}  # fmt: skip
        return report(self.acc, policy=self.policy.name, wall_s=time.perf_counter() - wall,
                      extra=extra)  # fmt: skip

    def _backfill_report(self) -> dict:
        """What reservations and lending did, and how wrong the estimates were."""
        out: dict = asdict(self.sched.backfill)
        late = np.asarray(out.pop("late_s"))
        out["late_p50_s"] = float(np.median(late)) if len(late) else 0.0
        out["late_p90_s"] = float(np.percentile(late, 90)) if len(late) else 0.0
        out["estimates"] = self.estimator.report() if self.estimator is not None else None
        return out

    def _account(self, t: float) -> None:
        dt = t - self.t_last
        if dt > 0:
            self.acc.allocated += self.by_kind * dt
            self.ledger.elapse(dt)
            self.t_last = t
        self.clock.set(t)

    def _maybe_cycle(self, t: float) -> bool:
        earliest = self.cycle_at + self.cfg.cycle_interval_s
        if t < earliest:
            if not self.cycle_queued:
                self.push(earliest, CYCLE)
                self.cycle_queued = True
            return True
        self.cycle_at = t
        start = time.perf_counter()
        decisions = self.sched.cycle()
        self.cycle_wall.append(time.perf_counter() - start)
        for d in decisions:
            self.apply(d, t)
        self._check("cycle", t)
        return False

    def _check(self, where: str, t: float) -> None:
        if not self.cfg.check_invariants:
            return
        problems = violations(self.sched)
        if where == "cycle":
            problems += spares_short(self.sched)
        if problems:
            raise AssertionError(f"after {where} at t={t:.0f} s: {problems}")

    def _arrive(self, r: TraceRecord, t: float) -> bool:
        w = to_workload(r)
        self.jobs[w.id] = Job(w, r.work_device_s)
        d = self.sched.submit(w)
        if d is not None:
            self.acc.rejected.append(f"{w.id}: {d.reason}")
            return False
        return True

    def _event(self, code: int, payload, t: float) -> bool:
        if code == COMPLETE:
            job, version = payload
            if version != job.version:
                return False
            self._advance(job, t)
            self.sched.complete(job.w)
            job.ended = t
            if self.estimator is not None:
                self.estimator.observe_end(job.w, t)
            self._set(job, 0, t, 0.0)
            self.acc.jct[job.w.kind].append(t - job.w.submit_s)
            return True
        if code == TICK:
            self._tick(t)
            return True
        if code == CYCLE:
            self.cycle_queued = False
            return True
        return self._fault_event(code, payload, t)

    def _fault_event(self, code: int, node: int, t: float) -> bool:
        if code == FAULT:
            self._next_fault(t)
            hardware = self.faults.is_hardware()
            if not self.sched.cap.up[node]:
                return False
            self.acc.faults += 1
            for d in recovery.node_failed(self.sched, node, t, hardware=hardware):
                self.apply(d, t)
            isolated = self._isolate(node, t, hardware)
            self._check("fault", t)
            if hardware or isolated:
                if node in self.sched.quarantined:
                    self.acc.quarantined += 1
                    self.push(t + self.cfg.quarantine_replace_s, REPLACE, node)
                else:
                    self.push(t + self.cfg.repair_s, REPAIR, node)
            return True
        if code == REPAIR:
            return recovery.node_repaired(self.sched, node)
        recovery.release_quarantine(self.sched, node)  # REPLACE: a healthy node
        self.faults.replaced(node)
        if self.isolation is not None:
            self.isolation.observe_replaced(node, t)
        return True

    def _isolate(self, node: int, t: float, hardware: bool) -> bool:
        """Ask the isolation about the fault; a node it quarantines leaves service now (a
        node still up is drained as after a hardware fault: its gangs move to spares)."""
        if self.isolation is None or not self.isolation.observe_fault(node, t, hardware=hardware):
            return False
        self.sched.quarantined.add(node)
        if self.sched.cap.up[node]:
            for d in recovery.node_failed(self.sched, node, t, hardware=True):
                self.apply(d, t)
        return True

    def _next_fault(self, t: float) -> None:
        when, node = self.faults.next_after(t)
        if when < self.horizon:
            self.push(when, FAULT, node)

    def _tick(self, t: float) -> None:
        step = self.cfg.tick_s
        if t > 0:
            for w in self.sched.services:
                needed = w.needed_replicas(t - step)
                if w.devices:
                    peak = self.held_by_service.get(w.id, 0.0) / w.devices
                    served = min(w.devices, needed) * step
                    self.ledger.credit(served, peak, self.ledger.serving_mfu, 1.0)
                self.acc.slo_steps += 1
                self.acc.slo_met += w.devices >= needed
                self.acc.idle_replicas_s += max(0, w.devices - needed) * step
        self.acc.samples_t.append(t)
        self.acc.samples.append(self.by_kind.copy())
        self.idle.sample(self.sched, min(step, self.horizon - t))
        if self.progress is not None:
            self.progress(t / self.horizon)
        self.push(t + step, TICK)

    # ---- applying decisions ------------------------------------------------------------
    def apply(self, d: Decision, t: float) -> None:
        w, action = d.workload, d.action
        if action == "replicas":
            self.by_kind[INFER] += d.after - d.before
            self._hold_replicas(w)
            return
        if action == "reject":
            self.acc.rejected.append(f"{w.id}: {d.reason}")
            return
        job = self.jobs[w.id]
        self._advance(job, t)
        runtime = self.cfg.runtime_budgets.get(self.policy.name, self.policy.runtime)
        if action == "start":
            if job.starts == 0:
                self.acc.queue[w.kind].append(t - w.submit_s)
            stall = 0.0 if job.starts == 0 else self.restart_s()
            job.starts += 1
            self._set(job, d.after, t, stall)
            self._spread(w)
            if self.estimator is not None:
                self.estimator.started(w, t)
        elif action == "resize":
            stall = growth.resize_cost(self.sched, w, d.before, d.after)
            self.acc.resizes += 1
            self.acc.resize_stall_device_s += stall * d.after
            self._set(job, d.after, t, stall)
            self._spread(w)
        elif action == "restart":
            self._lose(job, t)
            total = runtime.detection_s + runtime.restart_s + runtime.reload_s
            self._set(job, d.after, t, total)
        else:  # preempt, requeue
            self._lose(job, t)
            self._set(job, 0, t, 0.0)
            if action == "preempt":
                self.acc.preemptions += 1
            else:
                self.acc.requeues += 1

    def restart_s(self) -> float:
        """Seconds a restarted job stands still before it runs (restart + reload)."""
        runtime = self.cfg.runtime_budgets.get(self.policy.name, self.policy.runtime)
        return runtime.restart_s + runtime.reload_s

    def _advance(self, job: Job, t: float) -> None:
        if job.devices:
            s0 = job.t_update
            if job.stall_until > s0:
                self.acc.stalled[job.kind] += job.devices * (min(t, job.stall_until) - s0)
            start = max(s0, job.stall_until)
            if t > start:
                job.done += job.rate * (t - start)
                self.ledger.credit(job.devices * (t - start), job.peak, job.mfu, job.scaling)
        job.t_update = t

    def _lose(self, job: Job, t: float) -> None:
        if job.devices == 0 or t <= job.anchor:
            return
        elapsed = t - job.anchor
        ck = job.w.checkpoint_interval_s
        flash = self.policy.runtime.memory_checkpoint_s
        if flash > 0:
            ck = min(ck, flash) if ck > 0 else flash
        since = elapsed % ck if ck > 0 else elapsed
        job.done = max(0.0, job.done - job.rate * since)
        self.acc.lost[job.kind] += job.devices * since
        self.ledger.credit(-job.devices * since, job.peak, job.mfu, job.scaling)

    def _set(self, job: Job, devices: int, t: float, stall: float) -> None:
        self.by_kind[job.kind] += devices - job.devices
        held = job.devices * job.peak
        if devices:
            job.peak = self.ledger.peak[job.w.chip or ""]
            job.mfu, job.scaling = self.ledger.efficiency(job.w, devices, self._extra_leaves(job.w))
        self.ledger.hold(devices * job.peak - held)
        job.devices = devices
        job.version += 1
        job.t_update = t
        job.stall_until = job.anchor = t + stall
        if devices:
            per_device = self.ledger.speed(job.w, job.peak, job.mfu, job.scaling)
            job.rate = devices * (per_device or relative_speed(job.w.chip))
            end = job.stall_until + max(0.0, job.work - job.done) / job.rate
            self.push(end, COMPLETE, (job, job.version))
        else:
            job.rate = 0.0

    def _hold_replicas(self, w: Workload) -> None:
        peak, chips = self.ledger.peak, self.sched.cap.chips
        now = sum(c.devices * peak[chips[c.group]] for c in w.replicas)
        self.ledger.hold(now - self.held_by_service.get(w.id, 0.0))
        self.held_by_service[w.id] = now

    def _extra_leaves(self, w: Workload) -> float:
        """Share of the leaf switches `w` spans beyond the fewest that could hold it."""
        a = w.alloc
        if a is None or len(a.nodes) < 2:
            return 0.0
        cap = self.sched.cap
        used = len(set(cap.leaf[a.nodes].tolist()))
        per_leaf = self.per_leaf.get(a.group)
        if per_leaf is None:  # the topology is fixed: once per group
            s, e = cap.ranges[a.group]
            per_leaf = max(1, int(np.bincount(cap.leaf[s:e] - cap.leaf[s]).max()))
            self.per_leaf[a.group] = per_leaf
        return (used - math.ceil(len(a.nodes) / per_leaf)) / used

    def _spread(self, w: Workload) -> None:
        if w.alloc is None or len(w.alloc.nodes) < 2:
            return
        leaves = len(set(self.sched.cap.leaf[w.alloc.nodes].tolist()))
        self.acc.leaf_spread.append((1 - 0.05 * (leaves - 1) / leaves, w.alloc.devices))

    def _finish(self) -> None:
        self._account(self.horizon)
        self.acc.elastic_job_s = sum(
            (self.horizon if job.w.state != State.DONE else job.ended) - job.w.started_s
            for job in self.jobs.values()
            if job.w.elastic and job.w.started_s >= 0
        )
        for job in self.jobs.values():
            if job.devices:
                self._advance(job, self.horizon)
            elif job.starts == 0 and job.w.kind != "infer" and job.w.reject_reason == "":
                self.acc.unstarted[job.w.kind] += 1  # starved: its wait so far counts
                self.acc.queue[job.w.kind].append(self.horizon - job.w.submit_s)
