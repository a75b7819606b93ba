"""Pending workloads, kept per request shape, so admission costs O(shapes), not O(jobs).

A *shape* is what admission depends on: (queue, accepted chips, min, max, elastic). Two
pending workloads of one shape get the same answer from a fit check, so the admission
cycle tries only the head of each shape (the earliest in policy order) and merges the
heads by that order; when a head cannot start, its whole shape is skipped for the rest
of the cycle. A shape's last answer is remembered with the capacity versions of its chip
pools (`Capacity.version`), and it is not tried again until one of them changes: a pool
whose capacity did not change is skipped without a look.

    queue = PendingSet(key)           # key(w): the policy's order
    queue.add(w); queue.remove(w); w in queue; list(queue)   # policy order
    queue.waited_s(shape, now)        # seconds its workloads waited so far, summed: O(1)

It behaves as a read-only sequence for callers that only iterate, test membership, or
remove one workload (the server's adapter).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator

from argosy.scheduler.workload import Workload

Shape = tuple


def shape_of(w: Workload) -> Shape:
    return (w.queue, w.chips, w.min_devices, w.max_devices, w.elastic, w.per_node, w.min_node)


class PendingSet:
    """Pending workloads in policy order, grouped by shape."""

    def __init__(self, key: Callable[[Workload], tuple]) -> None:
        self.key = key
        self.by_shape: dict[Shape, list[Workload]] = {}
        self.shape: dict[int, Shape] = {}  # id(workload) -> its shape while pending
        self.known: dict[tuple[Shape, bool], tuple[int, tuple[int, ...]]] = {}
        """(shape, may borrow) -> (admission result, capacity versions it was found at)."""
        self.room_at: dict[Shape, float] = {}
        """Earliest time a shape may again try to make room by preemption."""
        self.submit_sum: dict[Shape, float] = {}
        """Sum of the submit times of each shape's pending workloads (for `waited_s`)."""

    def add(self, w: Workload) -> None:
        s = shape_of(w)
        self.shape[id(w)] = s
        bisect.insort(self.by_shape.setdefault(s, []), w, key=self.key)
        self.submit_sum[s] = self.submit_sum.get(s, 0.0) + w.submit_s

    def remove(self, w: Workload) -> None:
        s = self.shape.pop(id(w), None)
        if s is None:
            raise ValueError(f"{w.id} is not pending")
        entries = self.by_shape[s]
        if entries[0] is w:
            del entries[0]
        else:
            entries.remove(w)
        if entries:
            self.submit_sum[s] -= w.submit_s
        else:  # starts from an exact 0.0 again: no rounding carried over
            del self.by_shape[s], self.submit_sum[s]

    def waited_s(self, s: Shape, now: float) -> float:
        """Seconds the pending workloads of shape `s` have waited by `now`, summed (each
        was submitted at or before `now`): count x now - the sum of their submit times."""
        return len(self.by_shape[s]) * now - self.submit_sum[s]

    def heads(self) -> list[tuple[tuple, Shape]]:
        """(key of the head, shape) of every shape, as a heap."""
        out = [(self.key(ws[0]), s) for s, ws in self.by_shape.items()]
        heapq.heapify(out)
        return out

    def __contains__(self, w: object) -> bool:
        return id(w) in self.shape

    def __len__(self) -> int:
        return len(self.shape)

    def __bool__(self) -> bool:
        return bool(self.shape)

    def __iter__(self) -> Iterator[Workload]:
        return iter(sorted((w for ws in self.by_shape.values() for w in ws), key=self.key))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content
