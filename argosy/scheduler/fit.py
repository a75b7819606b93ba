"""Submission checks: is there any state of the cluster in which this workload starts?

    reason = never_fits(sched, w)    # "" or why it can never start (then it is rejected)
    n = elastic_size(12, d=8, least=10)  # 12: whole nodes (8) would fall below its min
    u = node_unit(w, d=4)                 # 3 for a job of 3 ranks per node: sizes step by 3

A workload is rejected at submission when no chip type it accepts could ever hold its
smallest gang (its largest under a policy without elasticity): unknown or absent chips,
more devices than the largest group of a chip, above its queue's ceilings, or more than
is left beside the *pinned* reservations of
that chip: other queues' guarantees (quota policies never lend them to gangs), the peak
replicas of single-chip inference services (they hold them at least once a day), and
the group's hot spares. Each is an upper bound, so nothing that could fit is rejected.
On success the accepted chips are narrowed to those that could hold it, fastest first.
"""

from __future__ import annotations

from argosy.core.errors import UnknownNameError
from argosy.hardware.catalog import default_catalog
from argosy.scheduler.speed import relative_speed
from argosy.scheduler.workload import Workload


def never_fits(sched, w: Workload) -> str:
    """Why `w` can never start on this cluster under this policy ("" if it can)."""
    catalog, have = default_catalog(), sched.cluster.devices_by_chip()
    need = w.min_devices if sched.policy.elastic else w.max_devices  # what it starts on
    chips: list[str] = []
    for name in w.chips:
        try:
            chips.append(catalog.canonical(name))
        except UnknownNameError as err:
            return str(err)
    usable = [c for c in chips if c in have]
    if not usable:
        return f"accepts chip types {chips}; the cluster has {list(have)}"
    if w.queue not in sched.tree.leaves:
        return sched.tree.leaf_error(w.queue)
    biggest = {c: _largest_group(sched, c, w.min_node) for c in usable}
    fits = [c for c in usable if biggest[c] >= need]
    if not fits:
        most = ", ".join(f"{chip} {n}" for chip, n in biggest.items())
        return (
            f"needs {need} devices in one node group (one chip, one node size); the "
            f"largest group of each chip it accepts holds: {most}"
        )
    if sched.policy.quotas:
        anc = sched.tree.ancestors[w.queue]
        ceil = {c: int(sched.tree.ceiling[anc, sched.tree.chip_index[c]].min()) for c in fits}
        if max(ceil.values()) < need:
            return f"needs {need} devices; queue '{w.queue}' ceilings: {ceil}"
    room = {c: min(biggest[c], have[c] - pinned(sched, c, w)) for c in fits}
    fits = [c for c in fits if room[c] >= need]
    if not fits:
        return (
            f"needs {need} devices of one type; beside pinned reservations "
            f"(other queues' guarantees, peak inference replicas, hot spares) at most "
            f"{room} can ever be free"
        )
    w.chips = tuple(sorted(fits, key=relative_speed, reverse=True))
    return ""


def _largest_group(sched, chip: str, min_node: int = 0) -> int:
    """Devices of the largest group of `chip` (of nodes of at least `min_node` devices),
    less the hot spares it will hold."""
    best = 0
    for g in sched.cap.groups(chip, min_node):
        group = sched.cluster.groups[g]
        spares = sched.spare_target(g) if sched.policy.hot_spares else 0
        best = max(best, group.num_devices - spares * group.devices_per_node)
    return best


def pinned(sched, chip: str, w: Workload) -> int:
    """Devices of `chip` that `w` can never hold: other queues' guarantees (with quotas)
    or the peak replicas of services pinned to `chip`, whichever is more."""
    guaranteed = 0
    if sched.policy.quotas:
        tree = sched.tree
        c = tree.chip_index[chip]
        guaranteed = int(tree.guarantee[:, c].sum() - tree.guarantee[tree.index[w.queue], c])
    replicas = sum(s.max_devices for s in sched.services if s.chips == (chip,) and s is not w)
    return max(guaranteed, replicas)


def elastic_size(n: int, d: int, least: int, step: int = 0) -> int:
    """The devices an elastic job takes of `n` it may have, on nodes of `d` (its
    `node_unit`): whole nodes, unless whole nodes fall below its `least` devices (then
    `n` itself, in whole multiples of `step`, its ranks per node)."""
    whole = (n // d) * d
    if whole >= max(least, 1):
        return whole
    return n - n % step if step > 1 else n


def node_unit(w: Workload, d: int) -> int:
    """Devices an elastic job holds on a whole node of `d` devices: `d`, or the most
    whole multiples of its ranks per node (`min_node`, its nproc_per_node) where those do
    not divide `d` (ranks 3 per node on 4-device nodes: 3 each). Its sizes and resizes
    step in these units, so it always holds a multiple of its ranks per node."""
    p = w.min_node
    if p <= 1 or d % p == 0 or p > d:
        return d
    return d - d % p
