"""Placement on the topology tree: best fit below a node, fewest leaf switches above."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=150, deadline=None)
@given(
    used=st.lists(st.integers(0, 8), min_size=8, max_size=8),
    per_node=st.integers(1, 8),
    nodes=st.integers(1, 8),
)
def test_a_per_node_shape_gets_exactly_its_devices_on_distinct_nodes(used, per_node, nodes):
    """Over random occupancy: `fits` with a per-node shape says yes exactly when enough
    nodes have that many free, and `place` then gives each of `nodes` distinct nodes
    exactly `per_node` devices, leaving the rest of the cluster as it was."""
    cap = Capacity(small_cluster())
    for node, n in enumerate(used):
        if n:
            cap.take(Allocation(0, np.array([node]), np.array([n])))
    before = cap.avail.copy()
    enough = sum(1 for n in used if 8 - n >= per_node) >= nodes
    assert cap.fits(0, per_node * nodes, per_node) == enough
    if per_node > 1:
        assert not cap.fits(0, per_node * nodes + 1, per_node)  # not whole nodes' worth
    placed = cap.place(0, per_node * nodes, per_node=per_node)
    assert (placed is not None) == enough
    if placed is None:
        return
    assert len(set(placed.nodes.tolist())) == nodes == len(placed.nodes)
    assert placed.counts.tolist() == [per_node] * nodes
    assert all(before[placed.nodes] >= per_node)
    cap.take(placed)
    assert (before - cap.avail).sum() == per_node * nodes
    cap.give(placed)
    assert (cap.avail == before).all()


def test_one_rank_per_node_is_not_packed():
    """Two one-device ranks on 8-device nodes: packed they share a node, with the shape
    they get one each on two nodes (a full node is kept whole for other gangs)."""
    cap = Capacity(small_cluster())
    cap.take(Allocation(0, np.array([1]), np.array([6])))
    cap.take(Allocation(0, np.array([2]), np.array([7])))
    assert len(cap.place(0, 2).nodes) == 1
    spread = cap.place(0, 2, per_node=1)
    assert sorted(spread.nodes.tolist()) == [1, 2] and spread.counts.tolist() == [1, 1]
