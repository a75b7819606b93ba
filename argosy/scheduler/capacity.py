"""The free-capacity index: free devices per node, kept per node group, as numpy arrays.

Every placement question is a vectorised question over one group's nodes (a group has
one chip type), and a histogram of nodes by free-device count answers "can anything of
size k fit here?" in O(1). Nothing here creates a Python object per device.

    cap = Capacity(cluster)
    alloc = cap.place(group=0, devices=64)   # whole nodes on as few leaf switches as possible
    cap.take(alloc); cap.give(alloc)

Placement rules: a request smaller than a node goes to the fullest node that still fits
it (best fit, keeps whole nodes whole); a request of whole nodes goes to the single leaf
switch with the fewest free nodes that is big enough, else to the leaves with the most
free nodes first (fewest leaves); a gang with a per-node shape gets exactly that many
devices on each of its nodes, the fullest nodes that fit first. Tensor-parallel groups
of up to a node's devices therefore never leave an NVLink domain. Down and hot-spare
nodes are invisible to placement (`avail` is 0 there).

One index convention: every node id that enters or leaves this class is global (an
index into `cluster.nodes`); `ranges[g]` is only used inside to slice a group's nodes.
Hot spares are owned here too: `reserve_spares(g, k)` holds whole idle nodes of group
`g` back, `take_spare(g, leaf)` hands one out, `mark_down` / `mark_up` follow faults.
"""

from __future__ import annotations

import numpy as np

from argosy.hardware.cluster import Cluster
from argosy.scheduler.workload import Allocation


class Capacity:
    """Free devices per node and per group, with O(1) fit checks."""

    def __init__(self, cluster: Cluster) -> None:
        nodes = cluster.nodes
        self.cluster = cluster
        self.group = np.array([n.group for n in nodes], dtype=np.int32)
        self.leaf = np.array([n.path[0] if n.path else n.domain for n in nodes], dtype=np.int32)
        self.cap = np.array([n.num_devices for n in nodes], dtype=np.int32)
        self.avail = self.cap.copy()
        self.up = np.ones(len(nodes), dtype=bool)
        self.spare = np.zeros(len(nodes), dtype=bool)
        self.spare_count = np.zeros(len(cluster.groups), dtype=np.int64)
        self.version = [0] * len(cluster.groups)
        """Per group: bumped by every change of its free capacity (admission's memory)."""
        self.chips = [g.chip.id for g in cluster.groups]
        self.dpn = [g.devices_per_node for g in cluster.groups]
        self.ranges: list[tuple[int, int]] = []
        start = 0
        for g in cluster.groups:
            self.ranges.append((start, start + g.num_nodes))
            start += g.num_nodes
        width = max(self.dpn) + 1
        self.hist = np.zeros((len(self.dpn), width), dtype=np.int64)
        for gi, (s, e) in enumerate(self.ranges):
            self.hist[gi, self.dpn[gi]] = e - s
        self.free_devices = np.array([g.num_devices for g in cluster.groups], dtype=np.int64)
        self._full: dict[int, tuple] = {}
        """Group -> (version, its whole free nodes, their leaves, the lowest leaf, nodes
        per leaf): what `_whole_nodes` derives from `avail`, kept until the group changes."""
        self._groups_of: dict[tuple[str, ...], list[int]] = {}  # chip types -> their groups
        self.groups_of_chip: dict[str, list[int]] = {}
        for gi, chip in enumerate(self.chips):
            self.groups_of_chip.setdefault(chip, []).append(gi)

    # ---- fit checks -------------------------------------------------------------------
    def fits(self, g: int, devices: int, per_node: int = 0) -> bool:
        """Whether `devices` could be placed on group `g` right now (never a false no);
        `per_node`: exactly that many on each node of the gang (0: packed)."""
        d = self.dpn[g]
        if per_node:
            nodes, rest = divmod(devices, per_node)
            return not rest and per_node <= d and int(self.hist[g, per_node:].sum()) >= nodes
        if devices <= d:  # a row of at most a node's devices + 1 counts: plain Python
            return any(self.hist[g].tolist()[devices:])
        whole, rest = divmod(devices, d)
        return int(self.hist[g, d]) >= whole + (1 if rest else 0)

    def groups(self, chip: str, min_node: int = 0) -> list[int]:
        """Groups of `chip` whose nodes have at least `min_node` devices each."""
        groups = self.groups_of_chip.get(chip, [])
        return groups if min_node <= 1 else [g for g in groups if self.dpn[g] >= min_node]

    def versions(self, chips: tuple[str, ...]) -> tuple[int, ...]:
        """Capacity versions of every group of `chips`: equal tuples, same capacity."""
        groups = self._groups_of.get(chips)
        if groups is None:
            groups = self._groups_of[chips] = [g for c in chips for g in self.groups_of_chip[c]]
        v = self.version
        return tuple([v[g] for g in groups])

    def whole_free_nodes(self, g: int) -> int:
        return int(self.hist[g, self.dpn[g]])

    def most_free(self, g: int) -> int:
        """Free devices of the freest node of group `g`."""
        row = self.hist[g].tolist()  # a few counts: a scalar scan
        return next((k for k in range(self.dpn[g], 0, -1) if row[k]), 0)

    def chip_free(self, chip: str) -> int:
        groups = self.groups_of_chip.get(chip, ())
        if len(groups) == 1:  # the usual case: one group per chip type
            return int(self.free_devices[groups[0]])
        return int(sum(self.free_devices[g] for g in groups))

    # ---- placement --------------------------------------------------------------------
    def place(
        self,
        g: int,
        devices: int,
        prefer_leaves: np.ndarray | None = None,
        per_node: int = 0,
        unit: int = 0,
    ) -> Allocation | None:
        """Where `devices` would go on group `g`, or None; changes nothing. `per_node`:
        exactly that many devices on each of `devices / per_node` distinct nodes. `unit`:
        packed at most that many on a node (an elastic job's `fit.node_unit`; 0: all)."""
        if devices <= 0 or not self.fits(g, devices, per_node):
            return None
        if per_node:
            return self._spread(g, devices // per_node, per_node)
        d = unit or self.dpn[g]
        if devices < d or devices == d < self.dpn[g]:  # on one node (a unit may be less)
            node = self._best_fit(g, devices)
            return Allocation(g, np.array([node]), np.array([devices], dtype=np.int32), devices)
        whole, rest = divmod(devices, d)
        nodes = self._whole_nodes(g, whole + (1 if rest else 0), prefer_leaves)
        if nodes is None:
            return None
        counts = np.full(len(nodes), d, dtype=np.int32)
        if rest:
            counts[-1] = rest
        return Allocation(g, nodes, counts, devices)

    def _spread(self, g: int, k: int, per_node: int) -> Allocation:
        """`per_node` devices on each of `k` nodes: the fullest nodes that fit first (whole
        nodes stay whole), then by leaf switch (fewest leaves)."""
        s, e = self.ranges[g]
        av = self.avail[s:e]
        ok = np.flatnonzero(av >= per_node)
        pick = ok[np.lexsort((self.leaf[s:e][ok], av[ok]))[:k]]
        nodes = s + np.sort(pick)
        return Allocation(g, nodes, np.full(k, per_node, dtype=np.int32), k * per_node)

    def _best_fit(self, g: int, devices: int) -> int:
        s, e = self.ranges[g]
        av = self.avail[s:e]
        row = self.hist[g].tolist()  # a few counts: a scalar scan beats np.flatnonzero
        level = next(k for k in range(devices, len(row)) if row[k])
        return s + int(np.argmax(av == level))  # the first node at that level

    def _free_nodes(self, g: int) -> tuple:
        """(whole free nodes of group `g` as offsets in it, their leaf switches, the lowest
        of those, whole free nodes per leaf from it), recomputed only when `g` changed."""
        known = self._full.get(g)
        if known is not None and known[0] == self.version[g]:
            return known[1:]
        s, e = self.ranges[g]
        full = np.flatnonzero(self.avail[s:e] == self.dpn[g])
        leaves = self.leaf[s:e][full]
        base = int(leaves.min()) if len(full) else 0
        counts = np.bincount(leaves - base)
        self._full[g] = (self.version[g], full, leaves, base, counts)
        return full, leaves, base, counts

    def _whole_nodes(self, g: int, k: int, prefer: np.ndarray | None) -> np.ndarray | None:
        s = self.ranges[g][0]
        full, leaves, base, counts = self._free_nodes(g)
        if len(full) < k:
            return None
        if prefer is None:
            fitting = np.flatnonzero(counts >= k)
            if fitting.size:
                best = fitting[np.argmin(counts[fitting])]
                return s + full[leaves - base == best][:k]
        score = counts.astype(np.int64)
        if prefer is not None and len(prefer):
            boost = np.zeros_like(score)
            inside = prefer[(prefer >= base) & (prefer < base + len(counts))] - base
            boost[inside] = 1 << 40
            score = score + boost
        order = np.argsort(-score, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        pick = np.argsort(rank[leaves - base], kind="stable")[:k]
        return s + np.sort(full[pick])

    # ---- bookkeeping ------------------------------------------------------------------
    def take(self, alloc: Allocation) -> None:
        self._change(alloc.group, alloc.nodes, -alloc.counts)

    def give(self, alloc: Allocation) -> None:
        self._change(alloc.group, alloc.nodes, alloc.counts)

    def _change(self, g: int, nodes: np.ndarray, delta: np.ndarray) -> None:
        if len(nodes) == 1:  # the common case, in scalars
            node = int(nodes[0])
            if not self.up[node] or self.spare[node]:
                return
            old = int(self.avail[node])
            new = old + int(delta[0])
            assert 0 <= new <= self.cap[node], "capacity over/underflow"
            self.avail[node] = new
            self.hist[g, old] -= 1
            self.hist[g, new] += 1
            self.free_devices[g] += new - old
            self.version[g] += 1
            return
        usable = self.up[nodes] & ~self.spare[nodes]
        if not usable.all():
            nodes, delta = nodes[usable], delta[usable]
        old = self.avail[nodes]
        new = old + delta
        assert (new >= 0).all() and (new <= self.cap[nodes]).all(), "capacity over/underflow"
        self.avail[nodes] = new
        hist = self.hist[g]
        if len(nodes) <= 8:  # a few nodes: a scalar loop beats two histograms
            for before, after in zip(old.tolist(), new.tolist(), strict=True):
                hist[before] -= 1
                hist[after] += 1
        else:
            hist -= np.bincount(old, minlength=len(hist))
            hist += np.bincount(new, minlength=len(hist))
        self.free_devices[g] += int(delta.sum())
        self.version[g] += 1

    # ---- faults and hot spares -----------------------------------------------------
    def _hide(self, node: int) -> None:
        g, old = int(self.group[node]), int(self.avail[node])
        self.avail[node] = 0
        self.hist[g, old] -= 1
        self.hist[g, 0] += 1
        self.free_devices[g] -= old
        self.version[g] += 1

    def _show(self, node: int, used: int = 0) -> None:
        g, new = int(self.group[node]), int(self.cap[node]) - used
        self.avail[node] = new
        self.hist[g, 0] -= 1
        self.hist[g, new] += 1
        self.free_devices[g] += new
        self.version[g] += 1

    def mark_down(self, node: int) -> None:
        """`node` failed: out of placement until `mark_up` (a held spare stops being one)."""
        if not self.up[node]:
            return
        if self.spare[node]:
            self.spare[node] = False
            self.spare_count[int(self.group[node])] -= 1
        else:
            self._hide(node)
        self.up[node] = False

    def mark_up(self, node: int) -> None:
        """`node` is repaired (or replaced): idle and placeable again."""
        if self.up[node]:
            return
        self.up[node] = True
        self._show(node)

    def reserve_spares(self, g: int, target: int) -> int:
        """Hold idle whole nodes of group `g` as hot spares until `target` are held (or
        no whole node is free); returns how many are held."""
        while self.spare_count[g] < target and self.whole_free_nodes(g) > 0:
            node = int(self._whole_nodes(g, 1, None)[0])  # a global id
            self._hide(node)
            self.spare[node] = True
            self.spare_count[g] += 1
        return int(self.spare_count[g])

    def take_spare(self, g: int, near_leaf: int) -> int | None:
        """A held spare of group `g` (on leaf switch `near_leaf` if one is), now placeable
        and idle; None if the group holds none."""
        if not self.spare_count[g]:
            return None
        s, e = self.ranges[g]
        held = s + np.flatnonzero(self.spare[s:e])
        same = held[self.leaf[held] == near_leaf]
        node = int(same[0] if len(same) else held[0])
        self.spare[node] = False
        self.spare_count[g] -= 1
        self._show(node)
        return node

    def spares_of(self, g: int) -> np.ndarray:
        """Global ids of the spares group `g` holds."""
        s, e = self.ranges[g]
        return s + np.flatnonzero(self.spare[s:e])
