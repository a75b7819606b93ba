"""Mixed-chip plans: batch shares follow speed, fit each chip's memory, and cost little."""

import pytest

from argosy.hardware.loader import load_cluster
from argosy.planner.hetero import plan_mixed
from argosy.planner.models import load_model

MIXES = [
    ("llama3-8b", "a100:32+h100:32+910b:40", 4096, 256),
    ("llama3-70b", "a100:512+h100:512", 4096, 1024),
    ("gpt3-175b", "h100:512+910b:512", 2048, 1536),
]


@pytest.mark.parametrize(("model", "cluster", "seq", "gbs"), MIXES, ids=[m[1] for m in MIXES])
def test_shares_cover_the_batch_and_every_group_fits(model, cluster, seq, gbs) -> None:
    spec, clus = load_model(model), load_cluster(cluster)
    mixed = plan_mixed(spec, clus, seq, gbs)
    assert mixed.feasible
    assert sum(p.samples for p in mixed.parts) == gbs
    for part in mixed.parts:
        plan = part.ranked.plan(0)
        assert plan.tp * plan.pp * plan.dp * plan.cp == part.group.num_devices
        assert part.ranked.costs.memory_gib[part.ranked.index(0)] <= part.group.chip.memory_gib
    assert mixed.efficiency() > 0.9


def test_faster_chip_takes_the_larger_share() -> None:
    mixed = plan_mixed(load_model("llama3-70b"), load_cluster("a100:512+h100:512"), 4096, 1024)
    a100, h100 = mixed.parts
    assert h100.samples > 1.5 * a100.samples
    assert abs(a100.step_s - h100.step_s) / h100.step_s < 0.1


def test_cross_group_sync_is_priced_on_the_slowest_nic() -> None:
    spec = load_model("llama3-70b")
    fast = plan_mixed(spec, load_cluster("a100:64+h100:64"), 4096, 256)
    slow = plan_mixed(spec, load_cluster("a100:64+h100:64", nic_gbps=25), 4096, 256)
    assert slow.sync_traffic_s == pytest.approx(fast.sync_traffic_s * 200 / 25, rel=0.01)
    assert slow.sync_s >= fast.sync_s


def test_a_homogeneous_cluster_has_no_sync_and_full_efficiency() -> None:
    mixed = plan_mixed(load_model("llama3-8b"), load_cluster("h100:64"), 4096, 256)
    assert mixed.sync_s == 0 and mixed.efficiency() == pytest.approx(1.0)
