"""The scheduler: submission checks, the admission cycle, and its state.

One `cycle()` does, in order: inference replicas (guarantees first), admission of
pending workloads in policy order with backfill, room-making for a few blocked
workloads (shrink elastic jobs, then evict whole gangs), elastic growth into what is
left, and hot-spare upkeep. It returns the decisions; the caller applies their effects.
Time comes only from the injected clock.
"""

from __future__ import annotations

import math

from argosy.core.clock import Clock, FakeClock
from argosy.hardware.cluster import Cluster
from argosy.scheduler import admission, backfill, elastic, estimates, fit, growth, room
from argosy.scheduler.capacity import Capacity
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.decisions import Decision
from argosy.scheduler.pending import PendingSet, shape_of
from argosy.scheduler.policies import Policy
from argosy.scheduler.queues import QueueTree
from argosy.scheduler.workload import State, Workload


class Scheduler:
    """Holds the cluster's allocation model and decides what runs where."""

    def __init__(
        self,
        cluster: Cluster,
        tree: QueueTree,
        policy: Policy,
        config: SchedulerConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.cluster = cluster
        self.cap = Capacity(cluster)
        self.tree = tree
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.clock = clock or FakeClock()
        tree.clock, tree.half_life_s = self.clock.now_s, self.config.usage_half_life_s
        self.pending = PendingSet(self._key)
        self.running: dict[str, Workload] = {}
        self.elastic_running: dict[str, Workload] = {}
        self.services: list[Workload] = []
        self.services_settled = -1
        self.services_step_s = 0.0  # shortest profile step of the services; 0: recompute
        self.out: list[Decision] = []
        self._seq: dict[str, int] = {}
        self._fits: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        self.failures: dict[int, list[float]] = {}
        self.quarantined: set[int] = set()
        self.hold_s: dict[int, tuple[float, float]] = {}  # group -> (mean hold, when seen)
        self.waited: dict[str, float] = {}  # chip -> device-seconds its pending work waited
        self._demand: dict[str, int] | None = None
        self._spare_targets: tuple[SchedulerConfig, list[int]] | None = None
        self.peak_ahead: dict[tuple[str, int, int], float] = {}
        """(service, profile step, steps ahead) -> peak load (`growth.service_need`)."""
        self.estimator: estimates.Estimator | None = None
        """Who tells run times (`argosy.scheduler.estimates`); None: no reservations."""
        self.ends = backfill.EndIndex(len(cluster.groups))
        self.reservations: dict[int, backfill.Reservation] = {}
        """Group -> this cycle's reservation on it (`argosy.scheduler.backfill`)."""
        self.backfill = backfill.BackfillStats()
        self._service_queues: tuple[int, ...] | None = None
        self.need_curves: dict[tuple, object] = {}
        """Services' need per forecast horizon (`backfill.need_curve`), by step and counts."""
        self.bound: tuple = ()
        """The last start refused for its run time: (chip, group, devices, lent, limit)."""
        self.fresh: set[str] = set()
        """Workloads started in this cycle: never evicted in it (their start and their
        preemption would both be decisions of one cycle)."""

    # ---- submission -------------------------------------------------------------------
    def submit(self, w: Workload) -> Decision | None:
        """Queue `w`, or reject it at once (with the reason) if it can never fit."""
        key = (tuple(w.chips), w.min_devices, w.max_devices, w.queue)
        known = self._fits.get(key)  # a pure function of the request's shape
        if known is None:
            known = self._fits[key] = (fit.never_fits(self, w), w.chips)
        reason, chips = known
        if reason:
            w.state, w.reject_reason = State.REJECTED, reason
            return Decision("reject", w, 0, 0, reason)
        w.chips = chips
        if w.kind == "infer":
            self.services.append(w)
            self._service_queues = None
            self._fits.clear()  # what is pinned beside later gangs changed
            self.services_settled = -1
            self.services_step_s = 0.0
            return None
        self._seq.setdefault(w.id, len(self._seq))
        self.enqueue(w)
        return None

    def forecast_changed(self) -> None:
        """A service's load profile changed: recompute every target at the next cycle."""
        self.peak_ahead.clear()
        for w in self.services:
            w.target_cache = (-1, 0)
        self.services_settled = -1
        self.services_step_s = 0.0

    def enqueue(self, w: Workload) -> None:
        w.state = State.PENDING
        self.pending.add(w)

    def _key(self, w: Workload) -> tuple:
        if self.policy.order == "fifo":
            return (w.submit_s, self._seq[w.id])
        return (-w.priority, w.submit_s, self._seq[w.id])

    # ---- the cycle --------------------------------------------------------------------
    def cycle(self) -> list[Decision]:
        """Decide what starts, stops, shrinks or grows now."""
        now = self.clock.now_s()
        self.out = []
        self.fresh = set()
        self._demand = None
        self.reservations = {}
        elastic.scale_services(self, now)
        blocked = admission.admit(self, now)
        if self.policy.preemption:
            self._make_room(blocked, now)
        if self.policy.elastic:
            elastic.grow(self, now)
        if self.policy.hot_spares:
            self._keep_spares()
        out, self.out = self.out, []
        return out

    def size_for(self, w: Workload, chip: str, g: int) -> int:
        """Devices `w` would start with on group `g`: its max, or for an elastic job the
        most whole nodes that are free now, within quota (its exact size where whole
        nodes would fall below its min: 10..14 devices on 8-device nodes start at 14);
        where those fall below its min, the most the free part of one node holds (2..8
        beside a 4-device job on an 8-device node: 4), so nothing is preempted for it
        while its minimum fits in free devices."""
        want = w.max_devices
        limit = 1 << 40
        if self.policy.quotas:
            free_for_q = self.free_for(w.queue, chip)
            if self.policy.reservations:  # services' idle guarantees may be lent (checked
                free_for_q += backfill.unused_service_guarantee(self, w.queue, chip)  # later)
            limit = min(self.tree.headroom(w.queue, chip), free_for_q)
        if not (self.policy.elastic and w.elastic):
            return want if want <= limit and self.cap.fits(g, want, w.per_node) else 0
        d = fit.node_unit(w, self.cap.dpn[g])
        whole = self.cap.whole_free_nodes(g) * d
        spare = int(self.cap.free_devices[g]) - room.buffer_devices(self, g)
        n = min(want, limit, whole, max(spare, w.min_devices))
        if self._may_start_overgrown(w, chip):  # idle nobody asks for: no resize later
            ahead = growth.service_need(self, chip, self.clock.now_s(), growth.SERVICE_LOOKAHEAD_S)
            n = max(n, min(growth.max_size(self, w), limit, whole, spare - ahead))
        size = fit.elastic_size(n, d, w.min_devices, w.min_node)
        if size < w.min_devices <= d:  # not its minimum on whole nodes: on one node's part
            part = min(want, limit, self.cap.most_free(g), d, max(spare, w.min_devices))
            size = part - part % w.min_node if w.min_node > 1 else part
        return size

    def _may_start_overgrown(self, w: Workload, chip: str) -> bool:
        """An elastic job may start above its nominal size (as it could grow there, but
        without the stall of a resize) while no other pending work asks for its chip."""
        if not (self.policy.elastic and w.elastic) or self.config.elastic_overgrow <= 1:
            return False
        return self.pending_demand().get(chip, 0) <= w.min_devices

    def start(
        self, w: Workload, chip: str, alloc, now: float, borrowed: int, lent: int = 0
    ) -> None:
        self.cap.take(alloc)
        self.tree.add(w.queue, chip, alloc.devices)
        w.alloc, w.chip, w.borrowed, w.lent = alloc, chip, borrowed, lent
        w.state = State.RUNNING
        if w.started_s < 0:
            w.started_s = now
        w.segment_s = now
        self.running[w.id] = w
        self.fresh.add(w.id)
        if w.elastic:
            self.elastic_running[w.id] = w
            w.last_resize_s = now  # no resize right after a start: it would stall at once
            if alloc.devices > w.max_devices:
                w.grown_s = now  # started overgrown: learn how long that was held
        if w.reserved_at_s >= 0 and w.started_s == now:  # its first start
            self.backfill.reserved_started += 1
            self.backfill.late_s.append(max(0.0, now - w.reserved_at_s))
        if self.policy.reservations:
            run = estimates.run_s(self, w, chip, alloc.devices)
            self.ends.started(w, None if run is None else now + run)
        self.out.append(Decision("start", w, 0, alloc.devices))

    def free_for(self, queue: str, chip: str) -> int:
        """Free devices of `chip` that `queue` may take: all but other queues' unused
        guarantees (negative when those are partly lent out already)."""
        return self.cap.chip_free(chip) - self.tree.reserved_for_others(queue, chip)

    def service_queues(self) -> tuple[int, ...]:
        """Rows of the queue tree that hold inference services (their guarantees follow a
        forecast, so they may be lent for a bounded time)."""
        if self._service_queues is None:
            self._service_queues = tuple(sorted({self.tree.index[s.queue] for s in self.services}))
        return self._service_queues

    def release(self, w: Workload, *, give: bool = True) -> int:
        """Free all of `w`'s devices (it completed, was evicted or lost a node)."""
        n = 0
        if w.alloc is not None:
            n = w.alloc.devices
            if give:
                self.cap.give(w.alloc)
            self.tree.add(w.queue, w.chip, -n)
            w.alloc = None
        self.running.pop(w.id, None)
        self.elastic_running.pop(w.id, None)
        self.ends.ended(w)
        w.borrowed = w.lent = 0
        return n

    def complete(self, w: Workload) -> None:
        """`w` finished its work."""
        growth.observe_shrink(self, w, self.clock.now_s())  # its growth was held to the end
        self.release(w)
        w.state = State.DONE

    def _make_room(self, blocked: list[Workload], now: float) -> None:
        tries = self.config.max_preemptors_per_cycle
        self.waited = self._waited(now) if blocked and self.policy.elastic else {}
        for w in blocked:
            if tries <= 0:
                break
            if w.next_room_s > now or w.state != State.PENDING:
                continue
            if self.policy.elastic and w.elastic and room.fits_free(self, w):
                continue  # its minimum fits in free devices: it waits for no room
            tries -= 1
            found = room.make_room(
                self, w, w.min_devices if self.policy.elastic else w.max_devices, now, urgent=False
            )
            if found is not None:
                chip, alloc = found
                borrowed = self.tree.borrowed_if(w.queue, chip, alloc.devices)
                self.start(w, chip, alloc, now, borrowed)
                self.pending.remove(w)
            else:
                w.next_room_s = now + 300.0
                self.pending.room_at[shape_of(w)] = w.next_room_s

    def pending_demand(self) -> dict[str, int]:
        """Devices pending work asks for, per chip type (cached until the next cycle)."""
        if self._demand is None:
            self._demand = growth.pending_demand(self)
        return self._demand

    def _waited(self, now: float) -> dict[str, float]:
        """Device-seconds waited so far by the pending work of each chip pool (what a
        batch of room made on that pool serves), counting each workload once."""
        out: dict[str, float] = {}
        pending = self.pending
        for shape in pending.by_shape:  # O(shapes): each shape keeps its submit-time sum
            chip = shape[1][0]
            out[chip] = out.get(chip, 0.0) + max(0.0, pending.waited_s(shape, now)) * shape[2]
        return out

    def _keep_spares(self) -> None:
        known = self._spare_targets
        if known is None or known[0] is not self.config:  # fixed by the config: once
            known = self._spare_targets = (
                self.config,
                [self.spare_target(g) for g in range(len(self.cluster.groups))],
            )
        for g, target in enumerate(known[1]):
            self.cap.reserve_spares(g, target)

    def spare_target(self, g: int) -> int:
        """Hot spares group `g` holds: enough to cover the hardware faults expected in it
        within one repair time (mean + 2 standard deviations of a Poisson count), at
        most a tenth of the group's nodes, and at least one in every group of two nodes
        or more (a one-node group would have nothing left to run on)."""
        group = self.cluster.groups[g]
        if group.num_nodes < 2:
            return 0
        cfg = self.config
        mean = group.num_devices * cfg.hardware_fault_rate_per_device_hour * cfg.repair_s / 3600
        want = math.ceil(mean + 2 * math.sqrt(mean))
        return max(1, min(want, group.num_nodes // 10))

    @property
    def spares(self) -> list[int]:
        """Hot spares held per group."""
        return [int(n) for n in self.cap.spare_count]

    def take_spare(self, g: int, near_leaf: int) -> int | None:
        """A hot-spare node of group `g` (same leaf switch if possible), now usable."""
        return self.cap.take_spare(g, near_leaf)
