"""An elastic job holds whole multiples of its ranks per node (nproc_per_node) on every
node, within its range, when nproc_per_node does not divide the node size: it starts,
grows and shrinks in those units."""

from __future__ import annotations

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.scheduler import fit
from argosy.scheduler.workload import Workload
from argosy.server.scheduling import Scheduling
from tests.server.test_control_decisions import FAST, spec


def _shape_ok(s: Scheduling, job_id: str, per_node: int, low: int, high: int) -> dict:
    nodes = s.placement(job_id).nodes
    total = sum(nodes.values())
    assert low * per_node <= total <= high * per_node, nodes
    assert all(k % per_node == 0 and k > 0 for k in nodes.values()), nodes
    return nodes


def test_node_unit() -> None:
    w = Workload("w", "train", "default", 0, ("cpu",), 3, 6)
    assert fit.node_unit(w, 4) == 4  # no ranks per node given (the simulator's): the node
    w.min_node = 3
    assert (fit.node_unit(w, 4), fit.node_unit(w, 8), fit.node_unit(w, 6)) == (3, 6, 6)
    assert fit.elastic_size(5, 3, 3, 3) == 3
    assert fit.elastic_size(10, 8, 10, 2) == 10  # below whole nodes: its exact size


def test_elastic_start_on_a_node_its_ranks_do_not_divide() -> None:
    s = Scheduling(
        [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 4)], None, "argosy", FAST, FakeClock(0.0)
    )
    assert not s.submit("j0", spec(per_node=3, elastic_to=2), 0.0)
    s.cycle()
    assert _shape_ok(s, "j0", 3, 1, 2) == {"n1": 3}


def test_elastic_grows_and_shrinks_in_units_of_its_ranks_per_node() -> None:
    clock = FakeClock(0.0)
    nodes = [NodeInfo(f"n{i}", "cpu", 8) for i in range(3)]
    s = Scheduling(nodes, None, "argosy", FAST, clock)
    assert not s.submit("fixed", spec(nnodes=2, per_node=8), 0.0)
    assert not s.submit("el", spec(per_node=3, elastic_to=5), 0.0)
    s.cycle()
    _shape_ok(s, "el", 3, 1, 5)
    clock.advance(100)
    s.finished("fixed")
    for _ in range(3):
        clock.advance(30)
        s.cycle()
        _shape_ok(s, "el", 3, 1, 5)
    grown = sum(s.placement("el").nodes.values())
    assert grown > 6
    assert not s.submit("big", spec(nnodes=2, per_node=8, priority=1), clock.now_s())
    for _ in range(3):
        clock.advance(30)
        s.cycle()
        _shape_ok(s, "el", 3, 1, 5)
