"""On the server's nodes an elastic job starts at the most whole multiples of its ranks
per node the free devices of a partly used node hold (at least its minimum) before
anything is evicted for it."""

from __future__ import annotations

import pytest
from test_control_decisions import FAST, spec

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.server.scheduling import Scheduling


@pytest.mark.parametrize("priority", [0, 1], ids=["same-priority", "higher-priority"])
@pytest.mark.parametrize(
    ("fixed", "per_node", "low", "high", "want"),
    [
        (4, 1, 2, 8, {"n0": 4}),  # half the node free: 4 of 2..8
        (3, 2, 1, 4, {"n0": 4}),  # 5 free, 2 ranks per node: 4
        (2, 3, 1, 2, {"n0": 6}),  # 6 free, 3 ranks per node: 6 (a whole node's worth)
    ],
    ids=["4-of-2..8", "2-per-node", "3-per-node"],
)
def test_elastic_job_starts_beside_a_fixed_job_on_one_node(fixed, per_node, low, high, want,
                                                           priority) -> None:  # fmt: skip
    clock = FakeClock(0.0)
    s = Scheduling([NodeInfo("n0", "cpu", 8)], None, "argosy", FAST, clock)
    assert not s.submit("fixed", spec(per_node=fixed), 0.0)
    assert [d.action for d in s.cycle()] == ["start"]
    clock.advance(3600.0)
    el = spec(nnodes=low, per_node=per_node, elastic_to=high, priority=priority)
    assert not s.submit("el", el, clock.now_s())
    out = [(d.action, d.workload.id) for d in s.cycle()]
    assert out == [("start", "el")]
    assert s.placement("el").nodes == want
    assert s.placement("fixed").nodes == {"n0": fixed}
