"""Admission: start pending workloads in policy order, one request shape at a time.

    blocked = admit(sched, now)   # starts what fits; returns heads that may make room

1. Merge the heads of every shape's queue by the policy's order (`PendingSet.heads`).
2. Try the head; a shape whose answer is known at the current capacity versions of its
   chip pools is not tried again (a pool that did not change is skipped).
3. Started: the next workload of that shape comes up (a workload that accepts several
   chip types tries the least contested first: `_by_contention`). Blocked: the whole shape is done
   for this cycle (its other workloads would get the same answer); under fifo its chip
   types are held, so every later workload that accepts one of them waits too.
   Needs borrowing: tried again in a second pass, least-served queues first (equal
   shares: the queue that held fewer devices lately first, `QueueTree.past_share`).
4. Under a policy with reservations (`argosy.scheduler.backfill`): the first workload of
   a pool blocked for want of devices reserves its start; later ones start ahead of it
   only if they end before or fit in what it leaves. A head refused only for its run
   time (it would end after a reservation or a lent guarantee is needed back) is not an
   answer for its shape: up to `backfill_scan` more of that shape are tried, soonest
   in policy order.
"""

from __future__ import annotations

import heapq

from argosy.scheduler import backfill, fit
from argosy.scheduler.pending import Shape
from argosy.scheduler.workload import Workload

STARTED, DEFER, BLOCKED, BOUNDED = 0, 1, 2, 3


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
        if result == BOUNDED:
            w, result = _scan_shape(sched, s, now, own)
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
            if result == BLOCKED and sched.policy.reservations:
                _reserve(sched, w, now)
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
    tree = sched.tree
    tree.advance(now)
    shares = {s[0]: (tree.share(s[0], throughput=aware), tree.past_share(s[0])) for s in deferred}
    deferred.sort(key=lambda s: (shares[s[0]], sched._key(q.by_shape[s][0])))  # noqa: SLF001
    for s in deferred:
        while s in q.by_shape:
            w = q.by_shape[s][0]
            if limit and offered.get(w.queue, 0) >= limit:
                break
            result = try_shape(sched, s, w, now, True)
            if result == BOUNDED:
                w, result = _scan_shape(sched, s, now, True)
            if result != STARTED:
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
    if result in (DEFER, BLOCKED):  # a run-time refusal is the workload's, not the shape's
        q.known[(s, allow_borrow)] = (result, versions)
    return result


def try_start(sched, w: Workload, now: float, *, allow_borrow: bool) -> int:
    deferred = bounded = False
    for chip in _by_contention(sched, w.chips):
        for g in sched.cap.groups(chip, w.min_node):
            n = sched.size_for(w, chip, g)
            if n < w.min_devices:
                continue
            ok, n, lent = _beside_reservations(sched, w, chip, g, n, now)
            if not ok:
                bounded = True
                continue
            if _start_on(sched, w, chip, g, n, lent, now, allow_borrow) == DEFER:
                deferred = True
                continue
            if w.alloc is not None:
                return STARTED
    return DEFER if deferred else BOUNDED if bounded else BLOCKED


def _start_on(sched, w, chip: str, g: int, n: int, lent: int, now: float, allow_borrow) -> int:
    """Start `w` on `n` devices of group `g` if they can be placed (and borrowed)."""
    borrowed = sched.tree.borrowed_if(w.queue, chip, n) if sched.policy.quotas else 0
    if borrowed and not allow_borrow:
        return DEFER
    unit = fit.node_unit(w, sched.cap.dpn[g]) if w.elastic else 0
    alloc = sched.cap.place(g, n, per_node=w.per_node, unit=unit)
    if alloc is None:
        return BLOCKED
    _count(sched, w, g, n, lent)
    sched.start(w, chip, alloc, now, borrowed, lent)
    return STARTED


def _beside_reservations(sched, w, chip: str, g: int, n: int, now: float):
    """(may start, on how many devices, how many of them lent): `n` as sized when its
    padded estimate fits the time limit there (`argosy.scheduler.backfill`), else for an
    elastic job the most that needs no time limit. A refusal leaves the limit in
    `sched.bound` for `_scan_shape`."""
    if not sched.policy.reservations:
        return True, n, 0
    limit, lent = backfill.time_limit(sched, w, chip, g, n, now)
    if backfill.runs_within(sched, w, chip, n, limit):
        return True, n, lent
    sched.bound = (chip, g, n, lent, limit)
    if not w.elastic:
        return False, n, 0
    room = backfill.free_without_lending(sched, w, chip, g)
    res = sched.reservations.get(g)
    if res is not None and res.workload is not w:
        room = min(room, res.extra)
    d = fit.node_unit(w, sched.cap.dpn[g])
    smaller = min(n, fit.elastic_size(room, d, w.min_devices, w.min_node))
    if smaller < w.min_devices:
        return False, n, 0
    return True, smaller, 0


def _count(sched, w: Workload, g: int, n: int, lent: int) -> None:
    """Keep the reservation's extra and the backfill counts in step with a start."""
    stats = sched.backfill
    if lent:
        stats.lent_starts += 1
    res = sched.reservations.get(g)
    if res is None:
        return
    if res.workload is w:
        del sched.reservations[g]
    elif n <= res.extra:
        res.extra -= n
        stats.in_extra += 1
    else:
        stats.backfilled += 1


def _reserve(sched, w: Workload, now: float) -> None:
    """`w` is blocked for want of devices: reserve its start if its pool has none yet."""
    groups = [g for c in w.chips for g in sched.cap.groups(c, w.min_node)]
    if any(g in sched.reservations for g in groups):
        return
    res = backfill.reserve(sched, w, now)
    if res is not None:
        sched.reservations[res.group] = res
        if w.reserved_at_s < 0:
            w.reserved_at_s = res.start_s
            sched.backfill.reserved += 1


def _scan_shape(sched, s: Shape, now: float, allow_borrow: bool) -> tuple[Workload, int]:
    """The head of shape `s` was refused for its run time: start the first of the next
    `backfill_scan` of the shape (policy order) whose estimate fits the same time limit;
    (the one started, or the head, and the result)."""
    entries = sched.pending.by_shape[s]
    chip, g, n, lent, limit = sched.bound
    if limit >= 0:
        for w in entries[1 : 1 + sched.config.backfill_scan]:
            if backfill.runs_within(sched, w, chip, n, limit):
                if _start_on(sched, w, chip, g, n, lent, now, allow_borrow) == STARTED:
                    return w, STARTED
                break
    sched.backfill.refused += 1
    return entries[0], BLOCKED


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
