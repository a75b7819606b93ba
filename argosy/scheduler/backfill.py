"""Backfill with reservations, and lending the services' idle guarantees for a bounded time.

Two rules, both for policies with `Policy.reservations` (argosy), both on estimates
(`argosy.scheduler.estimates`; without an estimator neither lends nor reserves):

*Reservations* (EASY backfill, done for gangs): the first workload of a chip pool that
is blocked for want of devices (not of quota) gets a reservation on the group where it
can start earliest: the *shadow time* at which enough running work there is expected to
have ended, and the *extra* devices that will still be free then beyond its need. Any
later workload may start on that group only if it is expected to end by the shadow time,
or fits in the extra (which it then uses up). Elastic jobs start no larger than the
extra unless they end in time.

*Lending*: an inference service's guarantee that its replicas do not use now is not
free for other queues' gangs (`QueueTree.reserved_for_others`): the service may need it
back at once. But its load follows a forecast, so a gang expected to end before the
services need those devices (`growth.service_need` over its padded run time) may hold
them: they are marked *lent* on the gang, which makes it the first to go if the services
need them early (urgent room-making evicts lent holders first).

    res = reserve(sched, w, now)                   # w blocked on capacity: a Reservation or None
    limit, lent = time_limit(sched, w, chip, g, n, now)  # longest run that may start now
    runs_within(sched, w, chip, n, limit)          # does w's padded estimate fit in it?

Costs: the shadow time sorts one group's running jobs by expected end, once per pool per
cycle; each check is a few dictionary lookups plus the services' forecast.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from argosy.scheduler import estimates
from argosy.scheduler.workload import Workload

DAY_S = 86400.0  # the services' load profile repeats daily: need over a day is the peak


@dataclass(slots=True)
class Reservation:
    """Devices held for one blocked workload from `start_s` on group `group`."""

    workload: Workload
    group: int
    start_s: float
    devices: int
    extra: int
    """Devices that stay free at `start_s` beyond `devices`: anyone may use them now."""


@dataclass(slots=True)
class BackfillStats:
    """What reservations and lending did over a run (for reports)."""

    reserved: int = 0
    """Workloads that got a reservation (each counted once)."""
    reserved_started: int = 0
    """Of those, how many started by now."""
    late_s: list[float] = field(default_factory=list)
    """Per reserved workload that started: seconds after its first promised start (0 if
    on time or early)."""
    backfilled: int = 0
    """Workloads started ahead of a reservation on its group because they end before it."""
    in_extra: int = 0
    """Workloads started on a reserved group within its extra devices."""
    refused: int = 0
    """Shapes refused in a cycle because their run would delay a reservation or outlast
    a lent guarantee (after `backfill_scan` of them were tried)."""
    lent_starts: int = 0
    """Gangs started on a service's idle guarantee."""


def reserve(sched, w: Workload, now: float) -> Reservation | None:
    """A reservation for `w` on the group of its chips where it can start earliest, or
    None when no estimate tells (or its quota, not capacity, holds it)."""
    if sched.estimator is None or not sched.policy.reservations:
        return None
    need = w.min_devices if (sched.policy.elastic and w.elastic) else w.max_devices
    best: Reservation | None = None
    for chip in w.chips:
        if sched.policy.quotas and sched.tree.headroom(w.queue, chip) < need:
            continue
        for g in sched.cap.groups(chip, w.min_node):
            r = _shadow(sched, w, chip, g, need, now)
            if r is not None and (best is None or r.start_s < best.start_s):
                best = r
    return best


def _shadow(sched, w: Workload, chip: str, g: int, need: int, now: float):
    """The earliest time `need` devices are expected free on group `g` for `w`."""
    have = free_without_lending(sched, w, chip, g)
    if have >= need:
        return Reservation(w, g, now, need, have - need)
    for t, freed in sched.ends.soonest(g):
        have += freed
        if have >= need:
            return Reservation(w, g, max(t, now), need, have - need)
    return None


def free_without_lending(sched, w: Workload, chip: str, g: int) -> int:
    """Devices of group `g` free for `w` now with nothing lent (quota policies: beside
    every other queue's unused guarantee)."""
    free = int(sched.cap.free_devices[g])
    if not sched.policy.quotas:
        return free
    return max(0, min(free, sched.free_for(w.queue, chip)))


@dataclass(slots=True)
class EndIndex:
    """Expected ends of the running gangs of each group, soonest first.

    An entry is written when a gang starts (its padded estimate then, as a batch
    system's time limit) and read lazily: a gang that ended, moved or restarted since is
    skipped, and a resized one frees what it holds now."""

    groups: int
    lists: list[list[tuple[float, int, object]]] = field(default_factory=list)
    current: dict[int, int] = field(default_factory=dict)  # id(workload) -> its entry
    seq: int = 0

    def __post_init__(self) -> None:
        self.lists = [[] for _ in range(self.groups)]

    def started(self, w: Workload, end_s: float | None) -> None:
        """`w` started (or restarted) on its allocation's group."""
        self.seq += 1
        if end_s is None or w.alloc is None:
            self.current.pop(id(w), None)
            return
        self.current[id(w)] = self.seq
        entries = self.lists[w.alloc.group]
        bisect.insort(entries, (end_s, self.seq, w))
        if len(entries) > 64 and len(entries) > 3 * len(self.current):
            self._purge(w.alloc.group)

    def ended(self, w: Workload) -> None:
        """`w` released its devices."""
        self.current.pop(id(w), None)

    def soonest(self, g: int):
        """(expected end, devices it frees) of group `g`'s live entries, soonest first."""
        current = self.current
        for end, seq, w in self.lists[g]:
            a = w.alloc  # type: ignore[attr-defined]
            if a is not None and a.group == g and current.get(id(w)) == seq:
                yield end, a.devices - w.lent  # type: ignore[attr-defined]

    def _purge(self, g: int) -> None:
        current = self.current
        self.lists[g] = [
            e for e in self.lists[g]
            if e[2].alloc is not None and current.get(id(e[2])) == e[1]
        ]  # fmt: skip


def time_limit(sched, w: Workload, chip: str, g: int, n: int, now: float) -> tuple[float, int]:
    """(the longest padded run time with which `w` may start on `n` devices of group `g`
    now: `math.inf` when nothing bounds it, negative when nothing would do; the devices
    of the start that would be lent from the services' guarantees)."""
    limit = math.inf
    res = sched.reservations.get(g)
    if res is not None and res.workload is not w and n > res.extra:
        limit = res.start_s - now
        if limit <= 0:
            return -1.0, 0
    lent = _lent(sched, w, chip, n)
    if lent:
        limit = min(limit, _lend_horizon(sched, w.queue, chip, now, lent))
    return limit, lent


def runs_within(sched, w: Workload, chip: str, n: int, limit: float) -> bool:
    """Whether `w` on `n` devices of `chip` is expected to end within `limit` seconds."""
    if limit == math.inf:
        return True
    if limit < 0:
        return False
    run = estimates.run_s(sched, w, chip, n)
    return run is not None and run <= limit


def _lend_horizon(sched, queue: str, chip: str, now: float, lent: int) -> float:
    """The longest time for which the services can spare `lent` more devices of their
    unused guarantees on `chip` (`lendable`), on the forecast's step grid."""
    room = _lend_room(sched, queue, chip)
    if room is None:
        return -1.0
    unused, spare = room
    need, step = need_curve(sched, chip, now)
    allowed = np.minimum(need, unused) <= spare - lent  # nondecreasing need: a prefix
    k = int(np.searchsorted(~allowed, True))  # steps ahead that stay lendable
    if k == len(need):
        return math.inf  # not needed back within the daily peak: lent for good
    return -1.0 if k == 0 else (k - 1) * step


def _lend_room(sched, queue: str, chip: str) -> tuple[int, int] | None:
    """(the services' unused guarantee on `chip` beside `queue`, the part of it free
    now), or None when there is none."""
    unused = unused_service_guarantee(sched, queue, chip)
    if unused <= 0:
        return None
    others = sched.tree.reserved_for_others(queue, chip) - unused  # non-service guarantees
    return unused, min(unused, sched.cap.chip_free(chip) - others)


def need_curve(sched, chip: str, now: float) -> tuple[np.ndarray, float]:
    """(devices the services pinned to `chip` add within k forecast steps, k = 0 .. a
    day; the step in seconds): `growth.service_need` for every horizon at once (a
    service without a load profile may want its peak at any time), kept until the step
    or the replica counts change."""
    services = [s for s in sched.services if s.chips[0] == chip]
    step = min((s.profile_step_s for s in services if s.profile is not None), default=DAY_S)
    key = (chip, int(now // step), tuple(s.replica_count for s in services))
    known = sched.need_curves.get(key)
    if known is not None:
        return known, step
    ks = np.arange(math.ceil(DAY_S / step) + 1)
    need = np.zeros(len(ks), dtype=np.int64)
    for s in services:
        if s.profile is None:  # no forecast: it may want all of its peak at any time
            need += max(0, s.max_devices - s.replica_count)
            continue
        profile = np.asarray(s.profile, dtype=float)
        first = int(now // s.profile_step_s) % len(profile)
        peak = np.maximum.accumulate(np.roll(np.tile(profile, 2), -first))
        ahead = np.minimum(np.ceil(ks * step / s.profile_step_s).astype(int), len(peak) - 1)
        want = np.ceil(s.max_devices * peak[ahead] - 1e-9).astype(np.int64)
        need += np.maximum(0, want - s.replica_count)
    if len(sched.need_curves) > 256:
        sched.need_curves.clear()
    sched.need_curves[key] = need
    return need, step


def _lent(sched, w: Workload, chip: str, n: int) -> int:
    """Devices of `n` that would come out of other queues' unused guarantees."""
    if not sched.policy.quotas:
        return 0
    return max(0, n - max(0, sched.free_for(w.queue, chip)))


def unused_service_guarantee(sched, queue: str, chip: str) -> int:
    """Devices of the services' guarantees on `chip` (other than `queue`'s) their
    replicas do not use now: what lending may add to what `queue` may start on."""
    tree = sched.tree
    c, mine = tree.chip_index[chip], tree.index[queue]
    total = 0
    for i in sched.service_queues():
        if i != mine:
            total += max(0, int(tree.guarantee[i, c]) - int(tree.usage[i, c]))
    return total


def lendable(sched, queue: str, chip: str, now: float, horizon_s: float) -> int:
    """Devices of the services' unused guarantees on `chip` (other than `queue`'s) that
    stay unneeded for `horizon_s`: free devices beside the other reservations, less what
    the services' forecast adds within the horizon, capped by their unused guarantee."""
    room = _lend_room(sched, queue, chip)
    if room is None:
        return 0
    unused, spare = room
    need, step = need_curve(sched, chip, now)
    k = min(len(need) - 1, math.ceil(horizon_s / step))
    return max(0, spare - min(unused, int(need[k])))
