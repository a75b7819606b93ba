"""Pipelines spanning chip types: layers cover the model, faster chips hold more, memory fits."""

import pytest

from argosy.hardware.loader import load_cluster
from argosy.planner.api import plan
from argosy.planner.layersplit import _split_layers, plan_layer_split
from argosy.planner.models import load_model

CASES = [
    ("llama3-70b", "a100:64+h100:48", 4096, 512),
    ("llama3-8b", "h100:64+h20:32", 4096, 512),
    ("llama3-8b", "a100:32+h100:32+910b:40", 4096, 256),
]


@pytest.mark.parametrize(("model", "cluster", "seq", "gbs"), CASES, ids=[c[1] for c in CASES])
def test_layers_cover_the_model_and_fit(model, cluster, seq, gbs) -> None:
    spec, clus = load_model(model), load_cluster(cluster)
    split = plan_layer_split(spec, clus, seq, gbs)
    assert split is not None
    assert sum(g.layers for g in split.groups) == spec.layers
    assert sum(g.stages for g in split.groups) == split.parallel.pp
    assert sum(g.devices for g in split.groups) == clus.num_devices
    chips = {g.chip.id: g.chip for g in clus.groups}
    for g in split.groups:
        assert g.layers >= g.stages
        assert g.memory_gib <= chips[g.chip].memory_gib


def test_faster_chip_gets_more_layers_per_stage() -> None:
    held = _split_layers(80, [4, 4], [2.0, 1.0], head=0.0)
    assert sum(held) == 80
    assert held[1] == pytest.approx(2 * held[0], abs=4)


def test_last_group_pays_for_the_lm_head() -> None:
    without = _split_layers(40, [2, 2], [1.0, 1.0], head=0.0)
    with_head = _split_layers(40, [2, 2], [1.0, 1.0], head=4.0)
    assert with_head[1] < without[1]


def test_mixed_plan_ranks_both_families() -> None:
    result = plan(load_model("llama3-8b"), load_cluster("a100:16+h100:16"), 4096, 64, top=10**6)
    families = {entry["split"] for entry in result["plans"]}
    assert families == {"batch", "layers"}
    steps = [e["predicted"]["step_time_s"] for e in result["plans"]]
    assert steps == sorted(steps)
