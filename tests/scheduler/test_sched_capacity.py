"""Placement on the topology tree: best fit below a node, fewest leaf switches above."""

import numpy as np
import pytest

from argosy.hardware.cluster import ClusterSpec, LevelSpec, NodeGroupSpec, TopologySpec, resolve
from argosy.scheduler.capacity import Capacity
from argosy.scheduler.workload import Allocation


def small_cluster(nodes=8, leaf_fanout=4):
    spec = ClusterSpec(
        groups=(NodeGroupSpec(chip="h100", count=8 * nodes),),
        topology=TopologySpec(levels=(LevelSpec(name="leaf", fanout=leaf_fanout),)),
    )
    return resolve(spec)


def test_sub_node_request_goes_to_the_fullest_node_that_fits():
    cap = Capacity(small_cluster())
    cap.take(Allocation(0, np.array([3]), np.array([6])))  # node 3 has 2 free
    cap.take(Allocation(0, np.array([5]), np.array([4])))  # node 5 has 4 free
    assert cap.place(0, 2).nodes.tolist() == [3]
    assert cap.place(0, 3).nodes.tolist() == [5]
    assert cap.place(0, 5).nodes.tolist() == [0]


@pytest.mark.parametrize(
    ("busy", "nodes", "expect_leaves"),
    [
        ([], 4, 1),  # a whole leaf is free: one leaf
        ([0], 3, 1),  # leaf 0 has exactly 3 free: best fit picks it, not leaf 1
        ([0, 4], 5, 2),  # no leaf has 5: two leaves, the fullest first
    ],
    ids=["whole-leaf", "best-fit-leaf", "two-leaves"],
)
def test_whole_node_gangs_use_as_few_leaves_as_possible(busy, nodes, expect_leaves):
    cap = Capacity(small_cluster())
    for n in busy:
        cap.take(Allocation(0, np.array([n]), np.array([8])))
    placed = cap.place(0, 8 * nodes)
    assert placed is not None and len(placed.nodes) == nodes
    assert len(set(cap.leaf[placed.nodes].tolist())) == expect_leaves
    assert not set(placed.nodes.tolist()) & set(busy)
    if busy == [0]:
        assert set(cap.leaf[placed.nodes].tolist()) == {0}


def test_fits_is_exact_for_whole_nodes_and_take_give_round_trip():
    cap = Capacity(small_cluster(nodes=4))
    a = cap.place(0, 24)
    cap.take(a)
    assert not cap.fits(0, 16) and cap.fits(0, 8) and cap.place(0, 16) is None
    cap.give(a)
    assert cap.free_devices[0] == 32 and cap.whole_free_nodes(0) == 4
    with pytest.raises(AssertionError):
        cap.give(a)  # giving back twice would over-count free devices
