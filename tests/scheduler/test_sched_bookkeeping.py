"""Bookkeeping that keeps a cycle's cost independent of the pending and running counts
gives the answers of the plain computation it replaces."""

from __future__ import annotations

import numpy as np
from sched_helpers import tree_for

from argosy.hardware.loader import load_cluster
from argosy.scheduler.pending import PendingSet, shape_of
from argosy.scheduler.workload import Workload


def _waited_by_hand(q: PendingSet, now: float) -> dict:
    return {s: sum(now - w.submit_s for w in ws) for s, ws in q.by_shape.items()}


def test_pending_waited_sums_follow_adds_and_removes():
    rng = np.random.default_rng(1)
    q = PendingSet(lambda w: (w.submit_s, w.id))
    live: list[Workload] = []
    for i in range(400):
        if live and rng.uniform() < 0.45:
            q.remove(live.pop(int(rng.integers(len(live)))))
        else:
            n = int(rng.choice([8, 16, 64]))
            w = Workload(f"w{i}", "eval", str(rng.choice(["a", "b"])), 0, ("h100",), n, n,
                         float(rng.uniform(0, 1e6)))  # fmt: skip
            q.add(w)
            live.append(w)
        now = 2e6 + i
        want = _waited_by_hand(q, now)
        assert set(want) == set(q.by_shape)
        for s, seconds in want.items():
            assert abs(q.waited_s(s, now) - seconds) <= 1e-9 * max(1.0, seconds)
    for w in live:  # an emptied shape forgets its sum (no rounding carried over)
        q.remove(w)
    assert not q.by_shape and not q.submit_sum
    w = Workload("x", "eval", "a", 0, ("h100",), 8, 8, 5.0)
    q.add(w)
    assert q.waited_s(shape_of(w), 7.5) == 2.5


def test_headroom_matches_the_ceilings_as_usage_moves():
    cluster = load_cluster("h100:256")
    tree = tree_for(cluster, guarantee=16, a_nominal=80, a_ceiling=100)
    chip = tree.chips[0]

    def by_hand(queue: str) -> int:
        anc, c = tree.ancestors[queue], tree.chip_index[chip]
        binding = tree.ceiling[anc, c] < tree.totals[c]
        if not binding.any():
            return 1 << 40
        return int((tree.ceiling[anc, c][binding] - tree.usage[anc[binding], c]).min())

    for step, (queue, n) in enumerate([("a", 40), ("svc", 8), ("a", 50), ("b", 64), ("a", -30)]):
        tree.add(queue, chip, n)
        for q in ("a", "b", "svc"):
            assert tree.headroom(q, chip) == by_hand(q), (step, q)
    assert tree.headroom("a", chip) == 100 - 60
    assert tree.headroom("b", chip) == 1 << 40
    tree.totals = np.array([90])  # a smaller cluster: a's ceiling no longer binds
    assert tree.headroom("a", chip) == by_hand("a") == 1 << 40
