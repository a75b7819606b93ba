"""Elastic training and tidal inference.

Inference services scale their replicas (one device each, packed best-fit so several
services share a machine) to a target: the peak replica count for policies without
co-location, or, with `tidal`, the load forecast for the next `forecast_lead_s` (the
service's daily profile), so replicas are up before the tide comes in. A service short
of devices within its guarantee takes them back at once (urgent room-making: lent and
borrowed increments go first).

Elastic training jobs grow in whole nodes into capacity nobody pending could use, on
the leaf switches they already occupy where possible; devices taken from another
queue's unused guarantee are marked *lent* and are the first given back. A job grows at
most once per `min_resize_interval_s`, by at least a twentieth of its size, only when
the growth pays for its checkpoint-resume stalls and never into capacity the services
of that chip will need soon (`argosy.scheduler.growth`); past its nominal size only
while nothing pending accepts its chip type.
"""

from __future__ import annotations

import numpy as np

from argosy.scheduler import fit, growth, room
from argosy.scheduler.decisions import Decision
from argosy.scheduler.workload import Allocation, Workload


def target_replicas(sched, w: Workload, now: float) -> int:
    if not sched.policy.tidal:
        return w.max_devices
    step = w.profile_step_s
    index = int(now // step)
    if w.target_cache[0] == index:
        return w.target_cache[1]
    ahead = int(np.ceil(sched.config.forecast_lead_s / step)) + 1
    # mid-step times: (index + k) * step // step can round down to the step before
    target = max(w.needed_replicas((index + k + 0.5) * step) for k in range(ahead + 1))
    w.target_cache = (index, target)
    return target


def scale_services(sched, now: float) -> None:
    """Bring every service to its target; skipped while the forecast step is the one at
    which every service last reached its target (a fault or a new service resets it)."""
    if not sched.services:
        return
    if not sched.services_step_s:
        sched.services_step_s = min(w.profile_step_s for w in sched.services)
    step = int(now // sched.services_step_s)
    if sched.services_settled == step:
        return
    settled = True
    for w in sched.services:
        before = w.devices
        target = target_replicas(sched, w, now)
        if target == before:
            continue
        if target < before:
            _shrink_service(sched, w, before - target)
        else:
            _grow_service(sched, w, target - before, now)
        w.recount()
        settled &= w.devices == target
        if w.devices != before:
            sched.out.append(Decision("replicas", w, before, w.devices))
    sched.services_settled = step if settled else -1


def _shrink_service(sched, w: Workload, excess: int) -> None:
    while excess > 0 and w.replicas:
        chunk = w.replicas[-1]
        chip = sched.cap.chips[chunk.group]
        if chunk.devices <= excess:
            w.replicas.pop()
            dropped = chunk
        else:
            kept, dropped = trim(chunk, excess)
            w.replicas[-1] = kept
        sched.cap.give(dropped)
        sched.tree.add(w.queue, chip, -dropped.devices)
        excess -= dropped.devices


def _grow_service(sched, w: Workload, missing: int, now: float) -> None:
    while missing > 0:
        placed = _place_chunk(sched, w, missing)
        if placed is None:
            if not sched.policy.preemption:
                return
            urgent = _below_guarantee(sched, w)
            found = room.make_room(sched, w, min(missing, 8), now, urgent=urgent, want=missing)
            if found is None:
                return
            placed = found[1]
        sched.cap.take(placed)
        sched.tree.add(w.queue, sched.cap.chips[placed.group], placed.devices)
        w.replicas.append(placed)
        missing -= placed.devices


def _place_chunk(sched, w: Workload, missing: int) -> Allocation | None:
    for chip in w.chips:
        for g in sched.cap.groups_of_chip[chip]:
            d = sched.cap.dpn[g]
            for n in (missing if missing < d else (missing // d) * d, min(missing, d - 1), 1):
                if n > 0 and (not sched.policy.quotas or _quota_ok(sched, w, chip, n)):
                    placed = sched.cap.place(g, n)
                    if placed is not None:
                        return placed
    return None


def _quota_ok(sched, w: Workload, chip: str, n: int) -> bool:
    return n <= min(sched.free_for(w.queue, chip), sched.tree.headroom(w.queue, chip))


def _below_guarantee(sched, w: Workload) -> bool:
    i = sched.tree.index[w.queue]
    return bool((sched.tree.usage[i] < sched.tree.guarantee[i]).any())


def trim(chunk: Allocation, k: int) -> tuple[Allocation, Allocation]:
    """Split `k` devices off the end of `chunk`: (kept, dropped)."""
    counts = chunk.counts.copy()
    dropped = np.zeros_like(counts)
    i = len(counts) - 1
    while k > 0:
        take = min(k, int(counts[i]))
        counts[i] -= take
        dropped[i] = take
        k -= take
        i -= 1
    keep_mask, drop_mask = counts > 0, dropped > 0
    kept = Allocation(chunk.group, chunk.nodes[keep_mask], counts[keep_mask])
    return kept, Allocation(chunk.group, chunk.nodes[drop_mask], dropped[drop_mask])


def grow(sched, now: float) -> None:
    cap = sched.cap
    demand = _demand_to_leave(sched)
    # what a job on group g could grow into: whole free nodes, less the arrivals' buffer
    # and what pending work asks for (never grown into: `_grow_one`'s reserve holds it),
    # so a backlog larger than the free room skips the pass without a look at the jobs
    room_for = []
    for g, chip in enumerate(cap.chips):
        whole, free = _room(sched, g)
        room_for.append(min(whole, free - demand.get(chip, 0)))
    if all(n < d for n, d in zip(room_for, cap.dpn, strict=True)):
        return
    cfg = sched.config
    gap, over, budget = cfg.min_resize_interval_s, cfg.elastic_overgrow, cfg.resize_budget_fraction
    dpn = cap.dpn
    # `_grow_one`'s cheap refusals first (room only shrinks during this loop); the last
    # is `growth.within_budget` for a grow and a shrink at the present size, whose two
    # stalls are also the allowance it adds: what is left is the budget's share of run time
    cands = [
        w
        for w in sched.elastic_running.values()
        if room_for[(a := w.alloc).group] >= dpn[a.group]
        and now - w.last_resize_s >= gap
        and a.devices < int(w.max_devices * over)
        and w.resize_stall_s <= budget * max(0.0, now - w.started_s)
    ]  # fmt: skip
    cands.sort(key=lambda w: (-w.priority, w.alloc.devices / w.max_devices, w.id))
    need: dict[tuple[str, float], int] = {}
    # growth changes neither the learnt hold times nor the services: one set of options
    # per group and chip serves every candidate on it
    per_group: dict[tuple[int, str], list[tuple[float, int]]] = {}
    # the most any option could add on a group (`_grow_one`'s `n` without the job's own
    # limits), kept per capacity version: a job whose smallest step exceeds it is skipped
    bounds: dict[tuple[int, str], tuple[int, int]] = {}
    version = cap.version
    for w in cands:
        g = w.alloc.group
        options = per_group.get((g, w.chip))
        if options is None:
            options = per_group[g, w.chip] = _options(sched, w, now, demand, need)
        known = bounds.get((g, w.chip))
        if known is None or known[0] != version[g]:
            whole, free = _room(sched, g)
            most = max(_increment(whole, free, reserve, dpn[g]) for _, reserve in options)
            known = bounds[g, w.chip] = (version[g], most)
        if known[1] < max(dpn[g], w.alloc.devices // 20):
            continue
        _grow_one(sched, w, now, growth.max_size(sched, w), options)


def _demand_to_leave(sched) -> dict[str, int]:
    """Devices growth leaves free per chip for pending work: all it asks for; under a
    policy with reservations and an estimator none, as admission has just started all
    pending work that may start, and what the blocked heads will need is theirs at their
    reservations (growth there is credited only until then: `_options`)."""
    if sched.policy.reservations and sched.estimator is not None:
        return {}
    return growth.pending_demand(sched)


def _room(sched, g: int) -> tuple[int, int]:
    """(devices in group `g`'s whole free nodes, its free devices less the arrivals'
    buffer): what growth may take there, before services, pending work and the job."""
    cap = sched.cap
    free = int(cap.free_devices[g]) - room.buffer_devices(sched, g)
    return cap.whole_free_nodes(g) * cap.dpn[g], free


def _increment(most: int, free: int, reserve: int, d: int) -> int:
    """Whole nodes of `d` devices a job may add: at most `most`, leaving `reserve` of
    `free`."""
    return (min(most, free - reserve) // d) * d


def _options(sched, w: Workload, now: float, demand: dict[str, int], need: dict) -> list:
    """(hold of the increment, devices reserved for services and pending work) for each
    horizon growth considers on `w`'s group (`growth.lookaheads`); `need` memoises the
    services' need per (chip, horizon)."""
    hold = growth.expected_hold_s(sched, w.alloc.group, now)
    res = sched.reservations.get(w.alloc.group)
    if res is not None:  # given back when the reservation starts
        hold = min(hold, max(0.0, res.start_s - now))
    options = []
    for ahead, credit in growth.lookaheads(sched, hold):
        if (w.chip, ahead) not in need:
            need[w.chip, ahead] = growth.service_need(sched, w.chip, now, ahead)
        options.append((credit, need[w.chip, ahead] + demand.get(w.chip, 0)))
    return options


def _grow_one(sched, w: Workload, now: float, limit: int, options) -> None:
    """Grow `w` by the most whole nodes that pay: for each (hold, reserve) option, the
    capacity beyond `reserve` (what services need within `hold`, and pending work) is
    expected to be held `hold` seconds; the largest increment that pays is taken."""
    cap, tree = sched.cap, sched.tree
    g, chip, size = w.alloc.group, w.chip, w.alloc.devices
    d = fit.node_unit(w, cap.dpn[g])
    whole, free = _room(sched, g)
    whole = whole // cap.dpn[g] * d
    most = min(limit - size, whole)
    if sched.policy.quotas:
        most = min(most, tree.headroom(w.queue, chip))
    add, smallest = 0, max(d, size // 20)
    for hold, reserve in options:
        n = _increment(most, free, reserve, d)
        if n <= add or n < smallest or not growth.pays(sched, w, n, hold):
            continue
        if growth.within_budget(  # this grow and the shrink after it
            sched, w, now, sum(growth.round_trip_s(sched, w, size, size + n))
        ):
            add = n
    if add <= 0:
        return
    lent = max(0, add - max(0, sched.free_for(w.queue, chip)))
    borrowed = tree.borrowed_if(w.queue, chip, add)
    placed = cap.place(g, add, prefer_leaves=cap.leaf[w.alloc.nodes], unit=d)  # repeats: no harm
    if placed is None:
        return
    cap.take(placed)
    tree.add(w.queue, chip, add)
    before = w.devices
    w.alloc = Allocation(
        g,
        np.concatenate([w.alloc.nodes, placed.nodes]),
        np.concatenate([w.alloc.counts, placed.counts]),
        before + placed.devices,
    )
    w.lent += lent
    w.borrowed += borrowed
    w.last_resize_s = now
    growth.charge(sched, w, before, w.devices)
    if w.grown_s < 0:
        w.grown_s = now
    sched.out.append(Decision("resize", w, before, w.devices, "grown into idle capacity"))
