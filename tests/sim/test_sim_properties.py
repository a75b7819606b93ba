"""Random mixed-vendor clusters, random traces, every policy (hypothesis).

For clusters of 1-6 chip types with groups from one node to over 200 nodes, traces of
jobs, elastic runs and inference services that accept random chip sets (some the
cluster lacks, some too big to ever fit), and a fault rate high enough that spares are
used and replaced: the simulation never raises, and after every cycle and every fault
`argosy.scheduler.invariants.violations` is empty (no device in two allocations,
allocations within capacity, spares whole and up, per-group counts consistent, queue
usage equal to what workloads hold).
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.hardware.cluster import ClusterSpec, NodeGroupSpec, resolve
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.trace import TraceRecord

CHIPS = ["a100-80g", "h100-sxm", "910b", "mi300x", "gaudi3", "h200", "mi250x", "b200"]
HORIZON_S = 6 * 3600.0
KINDS = ["train", "finetune", "eval", "debug"]


@st.composite
def clusters(draw):
    chips = draw(st.lists(st.sampled_from(CHIPS), min_size=1, max_size=6, unique=True))
    groups = []
    for chip in chips:
        nodes = draw(st.one_of(st.integers(1, 40), st.integers(190, 260)))
        per_node = 4 if chip == "mi250x" else 8
        groups.append(NodeGroupSpec(chip=chip, count=nodes * per_node))
    if draw(st.booleans()):  # a chip type in two groups
        groups.append(
            NodeGroupSpec(chip=chips[0], name="second", count=8 * draw(st.integers(1, 220)))
        )
    return resolve(ClusterSpec(groups=tuple(groups)))


@st.composite
def jobs(draw, i: int):
    kind = draw(st.sampled_from(KINDS))
    chips = draw(st.lists(st.sampled_from([*CHIPS, "h800"]), min_size=1, max_size=3, unique=True))
    size = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 256, 1024, 4096]))
    common = {
        "id": f"j{i}", "submit_s": draw(st.floats(0, HORIZON_S)), "kind": kind, "queue": kind,
        "priority": draw(st.integers(0, 300)), "chips": chips,
        "work_device_s": size * draw(st.floats(10, 20000)),
        "checkpoint_interval_s": draw(st.sampled_from([0.0, 600.0])),
    }  # fmt: skip
    if kind == "train" and size >= 16 and draw(st.booleans()):
        return TraceRecord(**common, min_devices=size // 4, max_devices=size)
    return TraceRecord(**common, devices=size)


@st.composite
def traces(draw, cluster):
    have = cluster.devices_by_chip()
    records = [draw(jobs(i)) for i in range(draw(st.integers(1, 60)))]
    services = []
    for i in range(draw(st.integers(0, 3))):
        chip = draw(st.sampled_from(list(have)))
        profile = draw(st.lists(st.floats(0, 1), min_size=1, max_size=6))
        peak = draw(st.integers(1, max(1, min(40, have[chip] // 4))))
        services.append(TraceRecord(
            id=f"svc{i}", submit_s=0.0, kind="infer", queue="infer", priority=1000,
            chips=[chip], devices=peak, load_profile=profile, profile_step_s=1800.0))  # fmt: skip
    return sorted(services + records, key=lambda r: r.submit_s)


def queues(cluster, records):
    by_chip = cluster.devices_by_chip()
    guarantee = dict.fromkeys(by_chip, 0)
    for r in records:
        if r.kind == "infer":
            guarantee[r.chips[0]] += int(r.devices)
    assert all(guarantee[c] <= n for c, n in by_chip.items())
    rest = {c: n - guarantee[c] for c, n in by_chip.items()}
    leaf = [{"name": k, "quota": {c: {"nominal": rest[c] // 4} for c in by_chip}} for k in KINDS]
    infer = {c: {"guarantee": g, "nominal": g, "ceiling": g} for c, g in guarantee.items()}
    spec = {"queues": [{"name": "org", "children": [*leaf, {"name": "infer", "quota": infer}]}]}
    return build_tree(QueuesFile.model_validate(spec), cluster)


@st.composite
def scenarios(draw):
    cluster = draw(clusters())
    records = draw(traces(cluster))
    sim = SimConfig(
        check_invariants=True,
        fault_rate_per_device_hour=draw(st.sampled_from([1e-4, 1e-3, 5e-3])),
        repair_s=draw(st.sampled_from([600.0, 3600.0, 4 * 3600.0])),
        quarantine_replace_s=3600.0,
        cycle_interval_s=draw(st.sampled_from([0.0, 5.0, 60.0])),
    )
    return cluster, records, sim, draw(st.integers(0, 2**16))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fifo", "quota", "argosy"])
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_any_cluster_any_trace_no_exception_and_invariants_hold(policy, scenario):
    cluster, records, sim, seed = scenario
    tree = queues(cluster, records)
    run = Simulation(cluster, tree, records, policies.get(policy), seed=seed,
                     horizon_s=HORIZON_S, sim=sim)  # fmt: skip
    report = run.run()  # invariants are checked after every cycle and every fault
    assert 0.0 <= report["allocation_rate"] <= 1.0 + 1e-9
    sched = run.sched
    for g in range(len(cluster.groups)):
        assert sched.spares[g] <= sched.spare_target(g)
