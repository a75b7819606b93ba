"""The scheduler: submission checks, the admission cycle, and its state.

One `cycle()` does, in order: inference replicas (guarantees first), admission of
pending workloads in policy order with backfill, room-making for a few blocked
workloads (shrink elastic jobs, then evict whole gangs), elastic growth into what is
left, and hot-spare upkeep. It returns the decisions; the caller applies their effects.
Time comes only from the injected clock.
"""

from __future__ import annotations

import bisect
import math

from argosy.core.clock import Clock, FakeClock
from argosy.core.errors import UnknownNameError
from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import Cluster
from argosy.scheduler import elastic, room
from argosy.scheduler.capacity import Capacity
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.decisions import Decision
from argosy.scheduler.policies import Policy
from argosy.scheduler.queues import QueueTree
from argosy.scheduler.speed import relative_speed
from argosy.scheduler.workload import State, Workload

STARTED, DEFER, BLOCKED = 0, 1, 2


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
        self.pending: list[Workload] = []
        self.running: dict[str, Workload] = {}
        self.elastic_running: dict[str, Workload] = {}
        self.services: list[Workload] = []
        self.services_settled = -1
        self.services_step_s = 0.0  # shortest profile step of the services; 0: recompute
        self.out: list[Decision] = []
        self._seq: dict[str, int] = {}
        self._fits: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        self._shapes: dict[str, tuple] = {}  # workload id -> what admission depends on
        self.failures: dict[int, list[float]] = {}
        self.quarantined: set[int] = set()

    # ---- submission -------------------------------------------------------------------
    def submit(self, w: Workload) -> Decision | None:
        """Queue `w`, or reject it at once (with the reason) if it can never fit."""
        key = (tuple(w.chips), w.min_devices, w.queue)
        known = self._fits.get(key)  # a pure function of the request's shape
        if known is None:
            known = self._fits[key] = (self._never_fits(w), w.chips)
        reason, chips = known
        if reason:
            w.state, w.reject_reason = State.REJECTED, reason
            return Decision("reject", w, 0, 0, reason)
        w.chips = chips
        if w.kind == "infer":
            self.services.append(w)
            self.services_settled = -1
            self.services_step_s = 0.0
            return None
        self._seq.setdefault(w.id, len(self._seq))
        self.enqueue(w)
        return None

    def forecast_changed(self) -> None:
        """A service's load profile changed: recompute every target at the next cycle."""
        for w in self.services:
            w.target_cache = (-1, 0)
        self.services_settled = -1
        self.services_step_s = 0.0

    def enqueue(self, w: Workload) -> None:
        w.state = State.PENDING
        bisect.insort(self.pending, w, key=self._key)

    def _key(self, w: Workload) -> tuple:
        if self.policy.order == "fifo":
            return (w.submit_s, self._seq[w.id])
        return (-w.priority, w.submit_s, self._seq[w.id])

    def _never_fits(self, w: Workload) -> str:
        catalog, have = default_catalog(), self.cluster.devices_by_chip()
        chips: list[str] = []
        for name in w.chips:
            try:
                chips.append(catalog.canonical(name))
            except UnknownNameError as err:
                return str(err)
        usable = [c for c in chips if c in have]
        if not usable:
            return f"accepts chip types {chips}; the cluster has {list(have)}"
        biggest = {
            c: max(self.cluster.groups[g].num_devices for g in self.cap.groups_of_chip[c])
            for c in usable
        }
        usable = [c for c in usable if biggest[c] >= w.min_devices]
        if not usable:
            return f"needs {w.min_devices} devices of one type; largest groups: {biggest}"
        if w.queue not in self.tree.leaves:
            return str(UnknownNameError("leaf queue", w.queue, self.tree.leaves))
        anc = self.tree.ancestors[w.queue]
        ceil = {c: int(self.tree.ceiling[anc, self.tree.chip_index[c]].min()) for c in usable}
        if self.policy.quotas and max(ceil.values()) < w.min_devices:
            return f"needs {w.min_devices} devices; queue '{w.queue}' ceilings: {ceil}"
        w.chips = tuple(sorted(usable, key=relative_speed, reverse=True))
        return ""

    # ---- the cycle --------------------------------------------------------------------
    def cycle(self) -> list[Decision]:
        """Decide what starts, stops, shrinks or grows now."""
        now = self.clock.now_s()
        self.out = []
        elastic.scale_services(self, now)
        blocked = self._admit(now)
        if self.policy.preemption:
            self._make_room(blocked, now)
        if self.policy.elastic:
            elastic.grow(self, now)
        if self.policy.hot_spares:
            self._keep_spares()
        out, self.out = self.out, []
        return out

    def _admit(self, now: float) -> list[Workload]:
        started: list[int] = []  # positions in `pending` of the workloads started
        deferred: list[Workload] = []
        at: dict[int, int] = {}  # id of a deferred workload -> its position
        blocked: list[Workload] = []
        depth = self.config.backfill_depth
        total_free = int(self.cap.free_devices.sum())
        heads, offered = self.policy.heads_per_queue, {}
        fifo = self.policy.order == "fifo"
        held: set[str] = set()  # fifo: chip pools whose head is blocked
        memo = ({}, {})  # per allow_borrow: request shape -> result, while nothing started
        own = not self.policy.quotas
        for i, w in enumerate(self.pending):
            if fifo and held.intersection(w.chips):
                if len(held) == len(self.cap.groups_of_chip):
                    break
                continue
            if total_free <= 0:  # nothing fits any more; the rest may only make room
                depth -= 1
                if fifo or depth <= 0 or len(blocked) >= 4 * self.config.max_preemptors_per_cycle:
                    break
                if w.next_room_s <= now:
                    blocked.append(w)
                continue
            if heads and offered.get(w.queue, 0) >= heads:
                continue
            result = self._try_start_memo(w, now, own, memo)
            if result == STARTED:
                offered[w.queue] = offered.get(w.queue, 0) + 1
                started.append(i)
                total_free -= w.devices
            elif result == DEFER:
                deferred.append(w)
                at[id(w)] = i
            else:
                blocked.append(w)
                held.update(w.chips)
                if not self.policy.backfill and not fifo:
                    break
                depth -= 1
                if depth <= 0:
                    break
        shares = {q: self.tree.share(q) for q in {w.queue for w in deferred}}
        deferred.sort(key=lambda w: (shares[w.queue], self._key(w)))
        for w in deferred:
            if heads and offered.get(w.queue, 0) >= heads:
                continue
            if self._try_start_memo(w, now, True, memo) == STARTED:
                offered[w.queue] = offered.get(w.queue, 0) + 1
                started.append(at[id(w)])
            else:
                blocked.append(w)
        for i in sorted(started, reverse=True):
            del self.pending[i]
        return blocked

    def _try_start_memo(self, w: Workload, now: float, allow_borrow: bool, memo) -> int:
        """`_try_start`, skipped for a request shaped like one that already failed since
        the last start: the answer depends only on the shape and on the cluster and quota
        state, which only a start changes during admission."""
        key = self._shapes.get(w.id)
        if key is None:
            key = self._shapes[w.id] = (w.queue, w.chips, w.min_devices, w.max_devices, w.elastic)
        known = memo[allow_borrow]
        result = known.get(key)
        if result is not None:
            return result
        result = self._try_start(w, now, allow_borrow=allow_borrow)
        if result == STARTED:
            memo[0].clear()
            memo[1].clear()
        else:
            known[key] = result
        return result

    def _try_start(self, w: Workload, now: float, *, allow_borrow: bool) -> int:
        deferred = False
        for chip in w.chips:
            for g in self.cap.groups_of_chip[chip]:
                n = self._size_for(w, chip, g)
                if n < w.min_devices:
                    continue
                borrowed = self.tree.borrowed_if(w.queue, chip, n) if self.policy.quotas else 0
                if borrowed and not allow_borrow:
                    deferred = True
                    continue
                alloc = self.cap.place(g, n)
                if alloc is None:
                    continue
                self.start(w, chip, alloc, now, borrowed)
                return STARTED
        return DEFER if deferred else BLOCKED

    def _size_for(self, w: Workload, chip: str, g: int) -> int:
        """Devices `w` would start with on group `g`: its max, or for an elastic job the
        most whole nodes that are free now, within quota."""
        want = w.max_devices
        limit = 1 << 40
        if self.policy.quotas:
            free_for_q = self.cap.chip_free(chip) - self.tree.reserved_for_others(w.queue, chip)
            limit = min(self.tree.headroom(w.queue, chip), free_for_q)
        if not (self.policy.elastic and w.elastic):
            return want if want <= limit and self.cap.fits(g, want) else 0
        d = self.cap.dpn[g]
        spare = int(self.cap.free_devices[g]) - room.buffer_devices(self, g)
        n = min(want, limit, self.cap.whole_free_nodes(g) * d, max(spare, w.min_devices))
        return (n // d) * d if n >= d else n

    def start(self, w: Workload, chip: str, alloc, now: float, borrowed: int) -> None:
        self.cap.take(alloc)
        self.tree.add(w.queue, chip, alloc.devices)
        w.alloc, w.chip, w.borrowed, w.lent = alloc, chip, borrowed, 0
        w.state = State.RUNNING
        if w.started_s < 0:
            w.started_s = now
        w.segment_s = now
        self.running[w.id] = w
        if w.elastic:
            self.elastic_running[w.id] = w
        self.out.append(Decision("start", w, 0, alloc.devices))

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
        w.borrowed = w.lent = 0
        return n

    def complete(self, w: Workload) -> None:
        """`w` finished its work."""
        self.release(w)
        w.state = State.DONE

    def _make_room(self, blocked: list[Workload], now: float) -> None:
        tries = self.config.max_preemptors_per_cycle
        for w in blocked:
            if tries <= 0:
                break
            if w.next_room_s > now or w.state != State.PENDING:
                continue
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

    def _keep_spares(self) -> None:
        for g in range(len(self.cluster.groups)):
            self.cap.reserve_spares(g, self.spare_target(g))

    def spare_target(self, g: int) -> int:
        """Hot spares group `g` holds: enough to cover the hardware faults expected in it
        within one repair time (mean + 2 standard deviations of a Poisson count), at
        least one, but at most a tenth of the group's nodes (a group of fewer than ten
        nodes holds none: one spare would be a large share of it)."""
        group = self.cluster.groups[g]
        cfg = self.config
        mean = group.num_devices * cfg.hardware_fault_rate_per_device_hour * cfg.repair_s / 3600
        want = max(1, math.ceil(mean + 2 * math.sqrt(mean)))
        return min(want, group.num_nodes // 10)

    @property
    def spares(self) -> list[int]:
        """Hot spares held per group."""
        return [int(n) for n in self.cap.spare_count]

    def take_spare(self, g: int, near_leaf: int) -> int | None:
        """A hot-spare node of group `g` (same leaf switch if possible), now usable."""
        return self.cap.take_spare(g, near_leaf)
