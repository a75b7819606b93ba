"""Admission: start pending workloads in policy order, one request shape at a time.

    blocked = admit(sched, now)   # starts what fits; returns heads that may make room

1. Merge the heads of every shape's queue by the policy's order (`PendingSet.heads`).
2. Try the head; a shape whose answer is known at the current capacity versions of its
   chip pools is not tried again (a pool that did not change is skipped).
3. Started: the next workload of that shape comes up (a workload that accepts several
   chip types tries the least contested first: `_by_contention`). Blocked: the whole shape is done
   for this cycle (its other workloads would get the same answer); under fifo its chip
   types are held, so every later workload that accepts one of them waits too.
   Needs borrowing: tried again in a second pass, least-served queues first.
"""

from __future__ import annotations

import heapq

from argosy.scheduler.pending import Shape
from argosy.scheduler.workload import Workload

STARTED, DEFER, BLOCKED = 0, 1, 2


def admit(sched, now: float) -> list[Workload]:
    """Start what fits now; returns blocked heads for room-making, in policy order."""
    q, policy = sched.pending, sched.policy
    fifo = policy.order == "fifo"
    limit = policy.heads_per_queue
    offered: dict[str, int] = {}
    held: set[str] = set()
    blocked: list[Workload] = []
    deferred: list[Shape] = []
    depth = sched.config.backfill_depth
    room_limit = 0 if fifo else 4 * sched.config.max_preemptors_per_cycle
    all_chips = len(sched.cap.groups_of_chip)
    own = not policy.quotas
    heap = q.heads()
    while heap:
        _, s = heapq.heappop(heap)
        w = q.by_shape[s][0]
        if fifo and held.intersection(w.chips):
            if len(held) == all_chips:
                break
            continue
        if limit and offered.get(w.queue, 0) >= limit:
            continue
        result = try_shape(sched, s, w, now, own)
        if result == STARTED:
            offered[w.queue] = offered.get(w.queue, 0) + 1
            q.remove(w)
            if s in q.by_shape:
                heapq.heappush(heap, (sched._key(q.by_shape[s][0]), s))  # noqa: SLF001
        elif result == DEFER:
            deferred.append(s)
        else:
            if len(blocked) < room_limit and q.room_at.get(s, 0.0) <= now:
                blocked.append(w)
            held.update(w.chips)
            depth -= 1
            if depth <= 0 or (not policy.backfill and not fifo):
                break
    _borrowers(sched, deferred, offered, blocked, room_limit, now)
    return blocked


def _borrowers(sched, deferred, offered, blocked, room_limit, now) -> None:
    """Second pass: shapes that need borrowed quota, least-served queues first."""
    q, limit = sched.pending, sched.policy.heads_per_queue
    aware = sched.policy.chip_aware
    shares = {s[0]: sched.tree.share(s[0], throughput=aware) for s in deferred}
    deferred.sort(key=lambda s: (shares[s[0]], sched._key(q.by_shape[s][0])))  # noqa: SLF001
    for s in deferred:
        while s in q.by_shape:
            w = q.by_shape[s][0]
            if limit and offered.get(w.queue, 0) >= limit:
                break
            if try_shape(sched, s, w, now, True) != STARTED:
                if len(blocked) < room_limit and q.room_at.get(s, 0.0) <= now:
                    blocked.append(w)
                break
            offered[w.queue] = offered.get(w.queue, 0) + 1
            q.remove(w)


def try_shape(sched, s: Shape, w: Workload, now: float, allow_borrow: bool) -> int:
    """`try_start` for the head `w` of shape `s`, answered from memory when nothing on
    its chip pools changed since the same question was last asked."""
    q = sched.pending
    versions = sched.cap.versions(w.chips)
    known = q.known.get((s, allow_borrow))
    if known is not None and known[1] == versions:
        return known[0]
    result = try_start(sched, w, now, allow_borrow=allow_borrow)
    if result != STARTED:
        q.known[(s, allow_borrow)] = (result, versions)
    return result


def try_start(sched, w: Workload, now: float, *, allow_borrow: bool) -> int:
    deferred = False
    for chip in _by_contention(sched, w.chips):
        for g in sched.cap.groups_of_chip[chip]:
            n = sched.size_for(w, chip, g)
            if n < w.min_devices:
                continue
            borrowed = sched.tree.borrowed_if(w.queue, chip, n) if sched.policy.quotas else 0
            if borrowed and not allow_borrow:
                deferred = True
                continue
            alloc = sched.cap.place(g, n)
            if alloc is None:
                continue
            sched.start(w, chip, alloc, now, borrowed)
            return STARTED
    return DEFER if deferred else BLOCKED


def _by_contention(sched, chips: tuple[str, ...]) -> tuple[str, ...]:
    """Chip types in the order to try them: least contested first (pending work that
    waits for that type, per device of it), then fastest. A job that accepts several
    types thus leaves a contested pool to the jobs pinned to it."""
    if len(chips) < 2 or not sched.policy.chip_aware:
        return chips
    demand = sched.pending_demand()
    have = sched.cluster.devices_by_chip()
    pressure = {c: demand.get(c, 0) / have[c] for c in chips}
    return tuple(sorted(chips, key=lambda c: pressure[c] > 0.05))  # stable: fastest first
