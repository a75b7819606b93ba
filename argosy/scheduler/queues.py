"""The queue tree: organisation > team > project, with quota per chip type.

Each queue carries, per chip type, three numbers (Volcano's guarantee / deserved /
capability, Kueue's nominal with lending and borrowing limits):

- `guarantee`: devices reserved for the queue and never lent to a workload that could
  not give them back at once (inference). Set on leaf queues only.
- `nominal`: the queue's fair share. Usage above it is *borrowed* and may be reclaimed.
- `ceiling`: usage never goes above it (default: the cluster's devices of that type).

An inner queue's nominal defaults to the sum of its children's (at most its ceiling).
Workloads name a leaf queue. `weight` scales a queue's fair share when borrowers compete
for idle capacity; between equal shares, the queue that held fewer devices lately (decayed
device-seconds, `used`) goes first, so a queue that floods the others with work cannot
keep every freed device by being first in line.

    tree = load_queues("queues.yaml", cluster)
    tree.admissible("eval", "h100-sxm", 8, free=120)   # -> (ok, borrowed devices)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from argosy.core.documents import Document, load_yaml, validate
from argosy.core.errors import ConfigError, UnknownNameError
from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import Cluster
from argosy.scheduler.speed import relative_speed


class QuotaSpec(BaseModel):
    """Quota of one queue for one chip type, in devices."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    guarantee: int = Field(default=0, ge=0)
    """Devices reserved for this (leaf) queue; never lent to others' gangs."""
    nominal: int | None = Field(default=None, ge=0)
    """Fair share; usage above it is borrowed. Default: guarantee, or the children's sum."""
    ceiling: int | None = Field(default=None, ge=0)
    """Hard cap on usage. Default: every device of this type in the cluster."""


class QueueSpec(BaseModel):
    """One queue and its children."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """Queue name, unique in the tree; workloads name leaf queues."""
    weight: float = Field(default=1.0, gt=0)
    """Relative weight among siblings when idle capacity is shared."""
    quota: dict[str, QuotaSpec] = Field(default_factory=dict)
    """Quota per chip type (catalog names or aliases)."""
    children: list[QueueSpec] = Field(default_factory=list)
    """Sub-queues."""


class QueuesFile(BaseModel):
    """A queues YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    queues: list[QueueSpec] = Field(min_length=1)
    """Top-level queues (organisations)."""


class QueueTree:
    """The resolved tree: arrays indexed [queue, chip] for quota and usage."""

    def __init__(self, names, parents, weights, guarantee, nominal, ceiling, chips) -> None:
        self.names: list[str] = names
        self.index = {name: i for i, name in enumerate(names)}
        self.parents: list[int] = parents
        self.weights = np.asarray(weights, dtype=float)
        self.chips: list[str] = chips
        self.chip_index = {c: i for i, c in enumerate(chips)}
        self.guarantee, self.nominal, self.ceiling = guarantee, nominal, ceiling
        self.usage = np.zeros_like(guarantee)
        self.speeds: np.ndarray | None = None  # relative speed per chip, filled on first use
        self.totals = ceiling.max(axis=0) if len(ceiling) else np.zeros(len(chips), int)
        children = {p for p in parents if p >= 0}
        self.leaves = [n for i, n in enumerate(names) if i not in children]
        self.ancestors = {n: np.array(self._chain(self.index[n])) for n in names}
        self.chain = {n: tuple(self._chain(self.index[n])) for n in names}
        """Leaf-to-root row indices of each queue, as Python ints (scalar loops)."""
        self._unused: dict[int, int] = {}
        """Chip column -> unused guarantees of all queues, summed once, then kept by `add`."""
        self.used = np.zeros(guarantee.shape, dtype=float)
        """Decayed device-seconds each queue held (`advance`): its recent past use."""
        self.clock: Callable[[], float] | None = None
        """Seconds now; set by the scheduler: `add` brings `used` up to date first."""
        self.half_life_s = 86400.0
        """Half-life of `used` (SchedulerConfig.usage_half_life_s)."""
        self._used_at: float | None = None

    def leaf_error(self, name: str) -> str:
        """Why `name` is not a queue jobs may name: a parent queue (its leaves listed), or
        unknown (the leaves listed, closest first)."""
        if name in self.index:
            i = self.index[name]
            under = [n for n in self.leaves if i in self.chain[n][1:]]
            return (
                f"'{name}' is a parent queue; jobs and tokens name a leaf queue under it:"
                f" {', '.join(under)}"
            )
        return str(UnknownNameError("leaf queue", name, self.leaves))

    def _chain(self, i: int) -> list[int]:
        out = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return out

    def leaf(self, name: str) -> np.ndarray:
        if name not in self.ancestors or name not in self.leaves:
            raise UnknownNameError("leaf queue", name, self.leaves)
        return self.ancestors[name]

    def headroom(self, queue: str, chip: str) -> int:
        """Devices the queue may still add before some ancestor hits an explicit ceiling
        (a ceiling of the whole cluster limits nothing the hardware does not)."""
        binding = self._binding.get((queue, chip))
        if binding is None:
            binding = self._binding[queue, chip] = self._binding_ceilings(queue, chip)
        if not binding:
            return 1 << 40
        c, usage = binding[0], self.usage  # a few rows: scalars beat fancy indexing
        return min(ceiling - int(usage[r, c]) for r, ceiling in binding[1])

    def _binding_ceilings(self, queue: str, chip: str) -> tuple:
        """(the chip's column, (row, ceiling) of each ancestor of `queue` whose ceiling on
        `chip` is below the cluster's devices of it), or () if none is: what `headroom`
        checks, found once per pair (ceilings are fixed; setting `totals` forgets them)."""
        anc, c = self.ancestors[queue], self.chip_index[chip]
        ceiling = self.ceiling[anc, c]
        binding = ceiling < self.totals[c]
        pairs = tuple(zip(anc[binding].tolist(), ceiling[binding].tolist(), strict=True))
        return (c, pairs) if pairs else ()

    @property
    def totals(self) -> np.ndarray:
        """Devices of each chip type in the cluster (a ceiling at or above limits nothing)."""
        return self._totals

    @totals.setter
    def totals(self, value: np.ndarray) -> None:
        self._totals = value
        self._binding = {}

    def reserved_for_others(self, queue: str, chip: str) -> int:
        """Unused guarantees of every other queue on `chip` (not free for `queue`)."""
        c = self.chip_index[chip]
        total = self._unused.get(c)
        if total is None:  # summed once per change of the column's usage
            total = self._unused[c] = int(
                np.maximum(self.guarantee[:, c] - self.usage[:, c], 0).sum()
            )
        i = self.index[queue]
        return total - max(0, int(self.guarantee[i, c]) - int(self.usage[i, c]))

    def borrowed_if(self, queue: str, chip: str, devices: int) -> int:
        """Devices of a `devices` request that would sit above some ancestor's nominal."""
        c, usage, nominal = self.chip_index[chip], self.usage, self.nominal
        over = max([int(usage[i, c]) - int(nominal[i, c]) for i in self.chain[queue]])
        return min(max(over + devices, 0), devices)  # clipping commutes with the max

    def within_nominal(self, queue: str, chip: str, devices: int) -> bool:
        """Whether the leaf queue stays within its own nominal share with `devices` more:
        it may then reclaim what other queues borrowed."""
        i, c = self.index[queue], self.chip_index[chip]
        return bool(self.usage[i, c] + devices <= self.nominal[i, c])

    def advance(self, now: float) -> None:
        """Decay `used` to `now` and add what each queue held since the last call (the
        usage, constant in between: every change comes through `add`)."""
        if self._used_at is None:
            self._used_at = now
        if now <= self._used_at:
            return
        keep = 0.5 ** ((now - self._used_at) / self.half_life_s)
        self.used *= keep
        self.used += self.usage * ((1.0 - keep) * self.half_life_s / math.log(2))
        self._used_at = now

    def inherit_use(self, old: QueueTree) -> None:
        """Take the decayed use of `old` (the same queues over fewer nodes) for every queue
        and chip both have: a cluster that grows does not forget who held it lately."""
        rows = [(i, old.index[n]) for n, i in self.index.items() if n in old.index]
        cols = [(c, old.chip_index[k]) for k, c in self.chip_index.items() if k in old.chip_index]
        for i, j in rows:
            for c, d in cols:
                self.used[i, c] = old.used[j, d]
        self._used_at = old._used_at  # noqa: SLF001  (the same class)

    def add_past_use(
        self, queue: str, chip: str, devices: int, start_s: float, end_s: float, now: float
    ) -> None:
        """Count `devices` held from `start_s` to `end_s` into the decayed use at `now`
        (rebuilding it from a record of what ran, as a restarted server does); a queue or
        chip this tree lacks counts for nothing, nor does time after `now` (a record
        dated ahead of this clock: a wall clock stepped back)."""
        start_s, end_s = min(start_s, now), min(end_s, now)
        if queue not in self.chain or chip not in self.chip_index or end_s <= start_s:
            return
        rate = math.log(2) / self.half_life_s
        late, early = math.exp(-rate * (now - end_s)), math.exp(-rate * (now - start_s))
        held = devices / rate * (late - early)
        c = self.chip_index[chip]
        for i in self.chain[queue]:
            self.used[i, c] += held
        if self._used_at is None:
            self._used_at = now

    def past_share(self, queue: str) -> float:
        """The queue's recent use over its nominal, divided by its weight (dominant over
        chips, like `share`): who held the devices lately, the tie-break between equal
        shares (Slurm's fair-share decay, Kueue's admission fair sharing)."""
        i = self.index[queue]
        ratio = self.used[i] / np.maximum(self.nominal[i], 1)
        return float(ratio.max()) / float(self.weights[i])

    def add(self, queue: str, chip: str, devices: int) -> None:
        if self.clock is not None:
            self.advance(self.clock())
        c, usage, guarantee = self.chip_index[chip], self.usage, self.guarantee
        unused = self._unused.get(c)
        for i in self.chain[queue]:  # a few rows: scalar updates beat fancy indexing
            if unused is not None:  # keep the column's unused guarantees in step
                left = int(guarantee[i, c]) - int(usage[i, c])
                unused += max(0, left - devices) - max(0, left)
            usage[i, c] += devices
        if unused is not None:
            self._unused[c] = unused

    def share(self, queue: str, *, throughput: bool = False) -> float:
        """The queue's share over its nominal, divided by its weight: dominant share (max
        over chips of usage / nominal), or with `throughput` what it holds over what it is
        owed, both in effective throughput (devices x the chip's relative speed, so a fast
        chip counts for more than a slow one)."""
        i = self.index[queue]
        if not throughput:
            ratio = self.usage[i] / np.maximum(self.nominal[i], 1)
            return float(ratio.max()) / float(self.weights[i])
        if self.speeds is None:
            self.speeds = np.array([relative_speed(c) for c in self.chips])
        held = float(self.usage[i] @ self.speeds)
        owed = float(np.maximum(self.nominal[i], 0) @ self.speeds)
        return held / max(owed, 1e-9) / float(self.weights[i])

    def guaranteed_total(self) -> dict[str, int]:
        return {c: int(self.guarantee[:, i].sum()) for i, c in enumerate(self.chips)}


def load_queues(path: str | Path, cluster: Cluster) -> QueueTree:
    """Load, validate and resolve a queues YAML file against `cluster`."""
    doc = load_yaml(Path(path))
    spec = validate(QueuesFile, doc)
    return build_tree(spec, cluster, doc)


def build_tree(spec: QueuesFile, cluster: Cluster, doc: Document | None = None) -> QueueTree:
    """Resolve specs to arrays; every impossible quota is a `ConfigError` with its line."""
    totals = cluster.devices_by_chip()
    chips = list(totals)
    flat: list[tuple[QueueSpec, int, tuple]] = []
    _flatten(spec.queues, -1, ("queues",), flat)
    n, c = len(flat), len(chips)
    guarantee = np.zeros((n, c), dtype=np.int64)
    nominal = np.full((n, c), -1, dtype=np.int64)
    ceiling = np.tile(np.array([totals[x] for x in chips], dtype=np.int64), (n, 1))
    names, parents, weights = [], [], []
    for i, (q, parent, path) in enumerate(flat):
        if q.name in names:
            raise _located(f"queue name '{q.name}' is used twice", doc, (*path, "name"))
        names.append(q.name)
        parents.append(parent)
        weights.append(q.weight)
        for chip_name, quota in q.quota.items():
            j = _chip_column(chip_name, chips, doc, (*path, "quota", chip_name))
            where = (*path, "quota", chip_name)
            if quota.guarantee and q.children:
                raise _located("guarantees belong on leaf queues", doc, (*where, "guarantee"))
            guarantee[i, j] = quota.guarantee
            if quota.nominal is not None:
                nominal[i, j] = quota.nominal
            if quota.ceiling is not None:
                ceiling[i, j] = quota.ceiling
    for j, chip in enumerate(chips):
        total = int(guarantee[:, j].sum())
        if total > totals[chip]:
            first = next(p for q, _, p in flat if chip in _canonical_keys(q))
            raise _located(
                f"queue guarantees for {chip} add up to {total} devices but the cluster has "
                f"{totals[chip]}",
                doc,
                (*first, "quota"),
            )
    _fill_nominal(nominal, guarantee, ceiling, parents)
    for i, (_, _, path) in enumerate(flat):
        for j, chip in enumerate(chips):
            if not guarantee[i, j] <= nominal[i, j] <= ceiling[i, j]:
                raise _located(
                    f"{chip}: need guarantee <= nominal <= ceiling, got "
                    f"{guarantee[i, j]} / {nominal[i, j]} / {ceiling[i, j]}",
                    doc,
                    (*path, "quota", chip),
                )
    tree = QueueTree(names, parents, weights, guarantee, nominal, ceiling, chips)
    tree.totals = np.array([totals[x] for x in chips], dtype=np.int64)
    return tree


def _flatten(specs, parent: int, path: tuple, out: list) -> None:
    for k, q in enumerate(specs):
        here = len(out)
        out.append((q, parent, (*path, k)))
        _flatten(q.children, here, (*path, k, "children"), out)


def _canonical_keys(q: QueueSpec) -> set[str]:
    catalog = default_catalog()
    return {catalog.canonical(k) for k in q.quota if k in catalog}


def _fill_nominal(nominal, guarantee, ceiling, parents: list[int]) -> None:
    for i in range(len(parents) - 1, -1, -1):  # children come after their parents
        kids = [k for k, p in enumerate(parents) if p == i]
        for j in range(nominal.shape[1]):
            if nominal[i, j] >= 0:
                continue
            total = sum(nominal[k, j] for k in kids) if kids else guarantee[i, j]
            nominal[i, j] = min(total, ceiling[i, j])  # children may overcommit


def _chip_column(name: str, chips: list[str], doc: Document | None, path: tuple) -> int:
    try:
        canonical = default_catalog().canonical(name)
    except UnknownNameError as err:
        raise _located(str(err), doc, path) from err
    if canonical not in chips:
        raise _located(f"chip '{canonical}' is not in the cluster (has {chips})", doc, path)
    return chips.index(canonical)


def _located(message: str, doc: Document | None, path: tuple) -> ConfigError:
    if doc is None:
        return ConfigError(message, field=".".join(str(p) for p in path))
    return ConfigError(
        message, source=doc.source, line=doc.line_of(path), field=".".join(map(str, path))
    )
