"""Making room for a blocked workload: shrink elastic jobs first, then evict whole gangs.

Room is made only if it makes the workload fit and pays: victims are released one by
one in a deterministic order and the placement is retried after each; if the workload
still does not fit, or what the victims would lose (resize stalls, rework, restarts)
exceeds the device-seconds the workload has already waited, every release is undone
and nothing happened. Victims are whole gangs
(never part of one), have run at least `min_runtime_s` and have been preempted fewer
than `max_preemptions_per_job` times, unless the request is *urgent* (a queue taking back
its guarantee from a borrower or a lent increment), which waits for nobody.

Order: elastic jobs holding increments lent from others' guarantees, then overgrown ones,
then other elastic jobs, each by priority and then by the device-seconds a shrink stalls
per device it frees (a resize pauses every device of the job for a checkpoint-resume,
`argosy.scheduler.resize_cost`, but loses no work; a shrink also restores the free
buffer for arrivals), then
evictions: borrowers first, then lower priority, youngest first (least lost work), then
by id.
"""

from __future__ import annotations

from argosy.scheduler import fit, growth
from argosy.scheduler.workload import TRAINING_KINDS, Allocation, Workload


def make_room(sched, w: Workload, n: int, now: float, *, urgent: bool, want: int = 0):
    """Free room for `n` devices of `w` on one of its chips; returns (chip, placement)
    with the placement not yet taken, or None with nothing changed. A shrink frees at
    least `want` devices when it can (an urgent service's whole shortfall: one stall per
    victim, not one per replica chunk)."""
    for chip in w.chips:
        if sched.policy.quotas and sched.tree.headroom(w.queue, chip) < n:
            continue
        entitled = not sched.policy.quotas or sched.tree.within_nominal(w.queue, chip, n)
        for g in sched.cap.groups(chip, w.min_node):
            found = _room_on_group(sched, w, chip, g, n, now, urgent, entitled, want)
            if found is not None:
                return chip, found
    return None


def fits_free(sched, w: Workload) -> bool:
    """Whether `w`'s minimum has a place in the free devices its queue may take now (an
    elastic job blocked then waits for a reservation or its quota, not for room: nothing
    is shrunk or evicted for it)."""
    for chip in w.chips:
        if sched.policy.quotas and sched.free_for(w.queue, chip) < w.min_devices:
            continue
        for g in sched.cap.groups(chip, w.min_node):
            unit = fit.node_unit(w, sched.cap.dpn[g])
            if sched.cap.place(g, w.min_devices, per_node=w.per_node, unit=unit) is not None:
                return True
    return False


def _room_on_group(sched, w, chip, g, n, now, urgent, entitled, want=0) -> Allocation | None:
    free, d = int(sched.cap.free_devices[g]), sched.cap.dpn[g]
    # a training queue taking back its share is not gated (evaluation waits for it to pay)
    owed = (entitled and w.kind in TRAINING_KINDS) or not sched.policy.elastic
    shrink = _shrinkable(sched, w, g, urgent)
    releasable = sum(v.alloc.devices - v.min_devices for v in shrink)
    evict = None  # found only when shrinking cannot be enough (the scan is the cost)
    if releasable + free < n:
        evict = _victims(sched, w, g, now, urgent, entitled)
        if releasable + sum(v.devices for v in evict) + free < n:
            return None
    undo: list[tuple[Workload, Allocation, Allocation | None]] = []
    missing = n - int(sched.cap.free_devices[g]) + buffer_devices(sched, g)
    if not urgent:  # shrink in batches: one stall serves the next arrivals too
        batch = int(sched.config.shrink_batch_fraction * sched.cluster.groups[g].num_devices)
        missing = max(missing, batch)
    elif sched.policy.batch_reclaim:  # the service's whole shortfall in one stall
        missing = max(missing, want - int(sched.cap.free_devices[g]))
    memo: dict[tuple, float] = {}  # many jobs share a state, size and floor
    shrink.sort(key=lambda v: _shrink_order(sched, v, fit.node_unit(v, d), missing, memo))
    unit = fit.node_unit(w, d) if w.elastic else 0
    for v in shrink:
        u = fit.node_unit(v, d)  # its nodes hold at most u each: dropping these keeps its min
        nodes = min((v.devices - v.min_devices) // u, max(1, -(-missing // u)))
        if nodes <= 0:
            continue
        keep, drop = _split(v.alloc, len(v.alloc.nodes) - nodes)
        sched.cap.give(drop)
        undo.append((v, v.alloc, keep))
        v.alloc = keep
        missing -= drop.devices
        placed = sched.cap.place(g, n, per_node=w.per_node, unit=unit)
        if placed is not None:
            return _settle(sched, w, n, undo, placed, now, urgent or owed)
    if evict is None:
        evict = _victims(sched, w, g, now, urgent, entitled)
    for v in evict[: sched.config.max_victims]:
        sched.cap.give(v.alloc)
        undo.append((v, v.alloc, None))
        placed = sched.cap.place(g, n, per_node=w.per_node, unit=unit)
        if placed is not None:
            return _settle(sched, w, n, undo, placed, now, urgent or owed)
    _undo(sched, undo)  # it did not fit: put everything back
    return None


def _undo(sched, undo) -> None:
    for v, old, keep in reversed(undo):
        sched.cap.take(old if keep is None else _split(old, len(keep.nodes))[1])
        v.alloc = old


def _settle(sched, w, n: int, undo, placed: Allocation, now: float, always: bool):
    """Keep the room made only if it pays: the device-seconds waited by the pending work of
    that chip pool (the room made is a batch that serves it; at least `w`'s own) must cover
    what the victims lose (ski rental: making room is never more than twice as costly as
    the better of waiting and making room at once). Urgent reclaims, a training job whose
    queue is within its nominal share (taking back what it is owed), and policies without
    elasticity always go ahead."""
    served = max(max(0.0, now - w.submit_s) * n, sched.waited.get(sched.cap.chips[placed.group], 0))
    if always or _cost(sched, undo, now) <= served:
        _commit(sched, undo, now)
        return placed
    _undo(sched, undo)
    return None


def _cost(sched, undo, now: float) -> float:
    """Device-seconds the victims lose: a shrunk job stalls all it keeps for a resize; an
    evicted one redoes half a checkpoint interval (or all it ran without checkpoints)
    and pays the policy's restart budget."""
    cost = 0.0
    for v, old, keep in undo:
        if keep is not None:
            cost += growth.resize_cost(sched, v, old.devices, keep.devices) * keep.devices
        else:
            ran = now - v.segment_s
            redo = min(ran, v.checkpoint_interval_s / 2) if v.checkpoint_interval_s else ran
            cost += old.devices * (redo + sched.policy.runtime.total_s)
    return cost


def buffer_devices(sched, g: int) -> int:
    """Devices elastic jobs leave free on group `g` for arrivals (0 without elasticity)."""
    if not sched.policy.elastic:
        return 0
    return int(sched.config.elastic_buffer_fraction * sched.cluster.groups[g].num_devices)


def _shrinkable(sched, w, g, urgent) -> list[Workload]:
    if not sched.policy.elastic:
        return []
    p = w.priority
    out = [
        v
        for v in sched.elastic_running.values()
        if (a := v.alloc) is not None and a.group == g and a.devices > v.min_devices
        and (urgent or v.priority <= p)
    ]  # fmt: skip
    return out


def _shrink_order(sched, v: Workload, d: int, missing: int, memo: dict | None = None) -> tuple:
    """Cheapest first: lent and overgrown increments, then by priority, then the fewest
    device-seconds stalled per device freed (the resize cost of the job's size and state
    times what it keeps, over what it gives: `missing` at most). `memo` keeps that cost
    per (state bytes, size, minimum size) over one sort."""
    devices = v.alloc.devices  # an elastic training job: what its allocation holds
    key = (v.state_bytes, devices, v.min_devices, d)
    per_device = memo.get(key) if memo is not None else None
    if per_device is None:
        nodes = min((devices - v.min_devices) // d, max(1, -(-missing // d)))
        freed = max(1, nodes * d)
        keep = devices - freed
        per_device = growth.resize_cost(sched, v, devices, keep) * keep / freed
        if memo is not None:
            memo[key] = per_device
    return (v.lent == 0, devices <= v.max_devices, v.priority, per_device, v.id)


def _victims(sched, w, g, now, urgent, entitled) -> list[Workload]:
    cfg, fresh = sched.config, sched.fresh  # started in this cycle: not evicted in it
    if urgent:
        out = [
            v
            for v in sched.running.values()
            if v.alloc is not None and v.alloc.group == g and v.kind != "infer"
            and v.id not in fresh and _evictable(v, w, now, cfg, urgent, entitled)
        ]  # fmt: skip
    else:  # `_evictable` inlined: this scan of every running job is a hot path
        p, q, runtime, most = w.priority, w.queue, cfg.min_runtime_s, cfg.max_preemptions_per_job
        shrink_only = sched.policy.elastic  # elastic jobs give room by shrinking
        out = [
            v
            for v in sched.running.values()
            if (a := v.alloc) is not None and a.group == g and v.kind != "infer"
            and not (shrink_only and v.elastic)
            and (v.priority < p or (entitled and v.borrowed > 0 and v.queue != q))
            and v.preemptions < most and now - v.segment_s >= runtime
            and v.id not in fresh
        ]  # fmt: skip
    out.sort(key=lambda v: (v.borrowed == 0, v.priority, -v.segment_s, v.id))
    return out


def _evictable(v, w, now: float, cfg, urgent: bool, entitled: bool) -> bool:
    if urgent and (v.borrowed > 0 or v.lent > 0):
        return True
    old_enough = now - v.segment_s >= cfg.min_runtime_s
    fresh = v.preemptions < cfg.max_preemptions_per_job
    reclaim = entitled and v.borrowed > 0 and v.queue != w.queue
    return old_enough and fresh and (v.priority < w.priority or reclaim)


def _split(alloc: Allocation, keep_nodes: int) -> tuple[Allocation, Allocation]:
    keep = Allocation(alloc.group, alloc.nodes[:keep_nodes], alloc.counts[:keep_nodes])
    drop = Allocation(alloc.group, alloc.nodes[keep_nodes:], alloc.counts[keep_nodes:])
    return keep, drop


def _commit(sched, undo, now: float) -> None:
    from argosy.scheduler.decisions import Decision

    for v, old, keep in undo:
        before = old.devices
        if keep is not None:
            growth.observe_shrink(sched, v, now)
            growth.charge(sched, v, before, keep.devices)
            sched.tree.add(v.queue, v.chip, keep.devices - before)
            v.lent = max(0, v.lent - (before - keep.devices))
            v.borrowed = max(0, v.borrowed - (before - keep.devices))
            v.last_resize_s = now
            v.segment_s = now
            sched.out.append(Decision("resize", v, before, keep.devices, "shrunk to make room"))
        else:
            v.alloc = old
            sched.release(v, give=False)
            v.preemptions += 1
            sched.enqueue(v)
            sched.out.append(Decision("preempt", v, before, 0, "evicted to make room"))
