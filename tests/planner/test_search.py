"""Plan search on one chip type: every returned plan is legal, fits, and is ranked."""

import time

import numpy as np
import pytest

from argosy.hardware.loader import load_cluster
from argosy.planner.models import load_model
from argosy.planner.search import search_group

CASES = [
    ("llama3-8b", "h100:64", 8192, 512),
    ("llama3-70b", "a100:512", 4096, 1024),
    ("mixtral-8x7b", "h100:128", 4096, 512),
    ("gpt3-175b", "910b:1024", 2048, 1536),
]


@pytest.mark.parametrize(
    ("model", "cluster", "seq", "gbs"), CASES, ids=[c[0] + "@" + c[1] for c in CASES]
)
def test_plans_are_legal_fit_and_sorted(model, cluster, seq, gbs) -> None:
    spec, group = load_model(model), load_cluster(cluster).groups[0]
    ranked = search_group(spec, group, seq, gbs)
    assert len(ranked) > 0
    steps = [ranked.step_s(r) for r in range(len(ranked))]
    assert steps == sorted(steps)
    for r in range(min(50, len(ranked))):
        p = ranked.plan(r)
        assert p.tp * p.pp * p.dp * p.cp == group.num_devices
        assert spec.heads % p.tp == 0 and spec.kv % p.tp == 0 and p.tp <= group.domain_size
        assert gbs % (p.dp * p.mbs) == 0
        assert ranked.costs.memory_gib[ranked.index(r)] <= group.chip.memory_gib
        assert p.expert_tp in (1, p.tp)
        if p.ep > 1:  # ep ranks hold different experts: they come from dp x cp x tp/etp
            holders = p.dp * p.cp * p.tp // p.expert_tp
            assert spec.experts % p.ep == 0 and holders % p.ep == 0


def test_moe_search_uses_expert_parallelism() -> None:
    spec, group = load_model("mixtral-8x7b"), load_cluster("h100:128").groups[0]
    ranked = search_group(spec, group, 4096, 512)
    assert any(ranked.plan(r).ep > 1 for r in range(min(200, len(ranked))))


def test_405b_on_16k_h100_is_quick_and_needs_model_parallelism() -> None:
    spec, group = load_model("llama3-405b"), load_cluster("h100:16384").groups[0]
    started = time.perf_counter()
    ranked = search_group(spec, group, 8192, 2048)
    assert time.perf_counter() - started < 5
    best = ranked.plan(0)
    assert best.tp * best.pp >= 8
    mfu = ranked.costs.model_flops[ranked.index(0)] / ranked.step_s(0) / (989e12 * 16384)
    assert 0.25 < mfu < 0.6


def test_fixed_fields_are_respected() -> None:
    spec, group = load_model("llama3-70b"), load_cluster("h100:256").groups[0]
    ranked = search_group(spec, group, 4096, 512, fixed={"tp": 4, "recompute": "full"})
    plans = [ranked.plan(r) for r in range(len(ranked))]
    assert plans and all(p.tp == 4 and p.recompute == "full" for p in plans)


def test_bigger_memory_chip_admits_more_plans() -> None:
    spec = load_model("llama3-70b")
    h100 = search_group(spec, load_cluster("h100:64").groups[0], 8192, 64)
    h200 = search_group(spec, load_cluster("h200:64").groups[0], 8192, 64)
    assert len(h200) > len(h100)
    assert np.all(h200.costs.memory_gib[h200.order] <= 141)


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-lm", "deepspeed", "torchtitan"])
def test_a_ranking_never_repeats_a_plan_under_an_alias_zero_stage(framework) -> None:
    """A ZeRO stage the framework runs exactly as a lower one is not enumerated, so no two
    rows differ in nothing but an equivalent stage."""
    from argosy.planner.frameworks import load_framework

    group = load_cluster("h100:64").groups[0]
    ranked = search_group(load_model("llama3-8b"), group, 8192, 512, framework=framework)
    stages = set(load_framework(framework).distinct_zero_stages())
    seen = {int(ranked.cands.zero[ranked.index(r)]) for r in range(len(ranked))}
    assert seen <= stages
    keys = [
        (p.tp, p.pp, p.dp, p.vpp, p.mbs, p.recompute, p.cp, p.ep, round(ranked.step_s(r), 9))
        for r in range(min(len(ranked), 200))
        for p in [ranked.plan(r)]
    ]
    assert len(set(keys)) == len(keys), "two rows differ only in an equivalent ZeRO stage"
