"""Hot spares on mixed clusters: every group holds its own, sized from its fault rate,
addressed by global node ids (groups after the first used to pick wrong nodes)."""

import numpy as np
import pytest
from sched_helpers import check_invariants, job

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler import recovery
from argosy.scheduler.capacity import Capacity
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree


def mixed(spec, policy="argosy", **config):
    cluster = load_cluster(spec)
    quota = {c: {"nominal": n} for c, n in cluster.devices_by_chip().items()}
    tree = build_tree(QueuesFile.model_validate({"queues": [{"name": "a", "quota": quota}]}),
                      cluster)  # fmt: skip
    clock = FakeClock()
    cfg = SchedulerConfig(**config)
    return Scheduler(cluster, tree, policies.get(policy), cfg, clock), clock


@pytest.mark.parametrize(
    "spec",
    ["a100-80g:4000+h100:4000", "a100-80g:4000+h100:4000+910b:2000", "h100:1600+h100:1600"],
    ids=["two-chips", "three-chips", "one-chip-two-groups"],
)
def test_every_group_reserves_spares_of_its_own_nodes(spec):
    sched, _ = mixed(spec)
    sched.cycle()
    check_invariants(sched)
    for g, (s, e) in enumerate(sched.cap.ranges):
        held = sched.cap.spares_of(g)
        assert len(held) == sched.spare_target(g) >= 1
        assert ((held >= s) & (held < e)).all()


def test_spare_target_follows_fault_rate_and_repair_time():
    low, _ = mixed("h100:4000", hardware_fault_rate_per_device_hour=1e-6)
    high, _ = mixed("h100:4000", hardware_fault_rate_per_device_hour=1e-4)
    slow, _ = mixed("h100:4000", hardware_fault_rate_per_device_hour=1e-4, repair_s=4 * 86400)
    assert low.spare_target(0) == 1  # at least one per group
    assert low.spare_target(0) < high.spare_target(0) < slow.spare_target(0)
    mean = 4000 * 1e-4 * 12  # expected hardware faults within one repair time
    assert high.spare_target(0) == int(np.ceil(mean + 2 * np.sqrt(mean)))
    tiny, _ = mixed("h100:64")
    assert tiny.spare_target(0) == 1  # eight nodes still hold one (an eighth of them)
    single, _ = mixed("h100:8")
    assert single.spare_target(0) == 0  # one node: nothing would be left to run on


def test_failed_gang_member_moves_to_a_spare_of_its_own_group():
    sched, clock = mixed("a100-80g:2000+h100:2000")
    gang = job("g", queue="a", devices=64, chips=("h100",))
    sched.submit(gang)
    sched.cycle()
    assert gang.alloc.group == 1
    node = int(gang.alloc.nodes[3])
    decisions = recovery.node_failed(sched, node, clock.now_s(), hardware=True)
    assert [d.action for d in decisions] == ["restart"]
    s, e = sched.cap.ranges[1]
    assert ((gang.alloc.nodes >= s) & (gang.alloc.nodes < e)).all()
    check_invariants(sched)
    sched.cycle()  # the spare used is replaced from the group's idle nodes
    assert sched.spares[1] == sched.spare_target(1)
    check_invariants(sched)


def test_a_held_spare_that_fails_stops_being_a_spare():
    cap = Capacity(load_cluster("a100-80g:800+h100:800"))
    assert cap.reserve_spares(1, 2) == 2
    spare = int(cap.spares_of(1)[0])
    assert spare >= cap.ranges[1][0]
    free = int(cap.free_devices[1])
    cap.mark_down(spare)
    assert cap.spare_count[1] == 1 and not cap.up[spare]
    cap.mark_up(spare)
    assert cap.free_devices[1] == free + 8 and cap.whole_free_nodes(1) == 100 - 1
    assert cap.take_spare(0, 0) is None
