"""Node isolation in the simulator: the health layer's node-record policy quarantines lemon
nodes, a quarantined node leaves service, and isolating lemons buys effective training
time."""

import pytest

from argosy.hardware.loader import load_cluster
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.generate import generate
from argosy.sim.isolation import HealthPolicyIsolation, NodeIsolation, NoIsolation

DAY = 86400.0
IMPLEMENTATIONS = {
    "none": NoIsolation,
    "health-policy": lambda: HealthPolicyIsolation(SchedulerConfig()),
}


@pytest.mark.parametrize("make", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
def test_every_isolation_keeps_the_contract(make):
    isolation: NodeIsolation = make()
    for i, hardware in enumerate((True, False, True)):
        assert isinstance(isolation.observe_fault(7, i * 3600.0, hardware=hardware), bool)
    assert isolation.observe_replaced(7, 10 * 3600.0) is None
    assert isolation.observe_fault(7, 11 * 3600.0, hardware=True) is False  # a fresh node


@pytest.mark.parametrize(
    ("gaps_days", "want"),
    [((1.0,), [False, True]), ((8.0,), [False, False]), ((3.0, 3.0), [False, True, True])],
    ids=["two-within-a-week", "two-a-week-apart", "repeat-offender"],
)
def test_health_policy_quarantines_repeat_faults_within_the_window(gaps_days, want):
    isolation = HealthPolicyIsolation(SchedulerConfig(quarantine_failures=2))
    times = [0.0]
    for gap in gaps_days:
        times.append(times[-1] + gap * DAY)
    got = [isolation.observe_fault(3, t, hardware=False) for t in times]
    assert got == want  # transient faults count as evidence too


def test_a_replaced_node_starts_clean():
    isolation = HealthPolicyIsolation(SchedulerConfig(quarantine_failures=2))
    assert [isolation.observe_fault(1, t, hardware=True) for t in (0.0, 60.0)] == [False, True]
    isolation.observe_replaced(1, DAY)
    assert isolation.observe_fault(1, DAY + 60.0, hardware=True) is False


def test_isolating_lemon_nodes_cuts_faults_and_raises_effective_training_time():
    cluster = load_cluster("h100:256")
    gen = generate(cluster, 8, seed=0)
    sim = SimConfig(fault_rate_per_device_hour=1e-3, lemon_fraction=0.1, lemon_factor=100,
                    check_invariants=True)  # fmt: skip

    def run(isolation):
        tree = build_tree(QueuesFile.model_validate(gen.queues), cluster)
        return Simulation(cluster, tree, gen.records, policies.get("argosy"), sim=sim,
                          isolation=isolation).run()  # fmt: skip

    off = run(NoIsolation())
    health = run(HealthPolicyIsolation(SchedulerConfig()))
    assert off["quarantined_nodes"] == 0 and health["quarantined_nodes"] >= 1
    assert health["faults"] < off["faults"]
    assert health["effective_training_time"] > off["effective_training_time"]
