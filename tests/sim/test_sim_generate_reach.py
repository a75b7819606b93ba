"""On a small cluster the generator never makes a pretraining gang that a policy without
elasticity could never place beside the services' pinned peak replicas: fifo and quota
run the whole trace, so `--compare` measures scheduling, not refused load."""

from __future__ import annotations

from argosy.hardware.loader import load_cluster
from argosy.sim.generate import _reach, generate


def test_no_gang_exceeds_what_the_pool_less_its_services_can_give() -> None:
    cluster = load_cluster("h100:256")
    gen = generate(cluster, days=2, seed=0)
    services = [r for r in gen.records if r.kind == "infer"]
    reach = _reach(cluster, services)
    assert reach["h100-sxm"] == 256 - sum(int(s.devices) for s in services)
    train = [r for r in gen.records if r.max_devices is not None]
    assert train
    for job in train:
        assert job.max_devices <= max(reach[c] for c in job.chips), job
        assert job.min_devices <= job.max_devices


def test_a_large_cluster_keeps_its_sizes() -> None:
    cluster = load_cluster("h100:2048")
    gen = generate(cluster, days=1, seed=0)
    sizes = {r.max_devices for r in gen.records if r.max_devices is not None}
    assert 256 in sizes  # the third quartile fits beside the services
