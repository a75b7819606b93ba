"""Block-method partial recompute: full recompute of the first k layers of each model chunk.

Memory falls and recompute time grows with k, k = 0 and k = chunk are the two ends
(no recompute, every layer), the search recomputes as few layers as fit where recomputing
none does not, and the plan text, parser and validation carry k.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.core.errors import ArgosyError, ConfigError
from argosy.hardware.loader import load_cluster
from argosy.planner.costmodel import Hardware, evaluate
from argosy.planner.models import load_model
from argosy.planner.parallel import Candidates, Parallel, check_parallel, parse_parallel
from argosy.planner.search import search_group

MODELS = ("llama3-70b", "llama3-405b", "mixtral-8x7b", "gpt3-175b")


def _priced(model, plans: list[Parallel], framework: str = "megatron-core", seq: int = 8192):
    group = load_cluster("h100:1024").groups[0]
    cands = Candidates.of(plans)
    hw = Hardware.of(group)
    return evaluate(model, hw, seq, cands, 64 / cands.dp, framework=framework)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4, 8]),
    vpp=st.sampled_from([1, 2]),
    mbs=st.sampled_from([1, 2]),
    flash=st.booleans(),
)
def test_memory_falls_and_recompute_grows_with_the_recomputed_layers(
    name, tp, pp, vpp, mbs, flash
) -> None:
    model = load_model(name)
    vpp = 1 if pp == 1 else vpp
    if model.kv % tp or pp * vpp > model.layers:
        return
    chunk = -(-model.layers // (pp * vpp))
    base = Parallel(tp=tp, pp=pp, dp=1024 // (tp * pp), vpp=vpp, mbs=mbs, zero=1, flash=flash)
    ks = sorted({0, 1, chunk // 2, chunk - 1} - {0})
    plans = [dataclasses.replace(base, recompute="none")]
    plans += [dataclasses.replace(base, recompute="full", recompute_layers=k) for k in ks]
    plans += [dataclasses.replace(base, recompute="full")]
    costs = _priced(model, plans)
    mem, rec = costs.memory_gib, costs.recompute_s
    assert np.all(np.diff(mem) <= 1e-9), mem
    assert np.all(np.diff(rec) >= -1e-12), rec
    assert rec[0] == 0.0 and rec[-1] > 0.0
    inner = slice(1, len(plans) - 1)  # 0 < k < chunk: strictly between the two ends
    assert np.all((rec[inner] > 0.0) & (rec[inner] < rec[-1])), rec
    assert np.all((mem[inner] < mem[0]) & (mem[inner] > mem[-1])), mem
    # k = chunk would be every layer: the share is 1, as for recompute=full
    every = dataclasses.replace(base, recompute="full", recompute_layers=chunk)
    assert Candidates.of([every]).recompute_share(model.layers)[0] == 1.0


def test_search_recomputes_as_few_layers_as_fit() -> None:
    """Llama 3 405B at seq 8192 on tp8 pp16: no recompute does not fit, all layers do."""
    model, group = load_model("llama3-405b"), load_cluster("h100:8192").groups[0]
    fixed = {"tp": 8, "pp": 16, "dp": 64, "zero": 2, "mbs": 1}
    ranked = search_group(model, group, 8192, 2048, fixed=fixed, framework="megatron-core")
    best = ranked.plan(0)
    assert best.partial_recompute, best
    cap = group.chip.memory_gib
    assert ranked.costs.memory_gib[ranked.index(0)] <= cap
    # one layer fewer does not fit (or k was already the least), and full is slower
    fewer = dataclasses.replace(best, recompute_layers=best.recompute_layers - 1)
    full = dataclasses.replace(best, recompute_layers=0)
    costs = _priced(model, [fewer, full, best])
    if best.recompute_layers > 1:
        assert costs.memory_gib[0] > cap or costs.step_s[0] >= costs.step_s[2]
    assert ranked.step_s(0) < float(
        search_group(
            model, group, 8192, 2048, fixed={**fixed, "recompute": "full", "vpp": best.vpp}
        ).step_s(0)
    )


@pytest.mark.parametrize("framework", ["torchtitan", "pytorch"])
def test_frameworks_without_the_block_method_never_get_partial_plans(framework) -> None:
    model, group = load_model("llama3-70b"), load_cluster("h100:64").groups[0]
    ranked = search_group(model, group, 8192, 256, framework=framework)
    assert len(ranked) > 0
    assert not any(ranked.plan(r).partial_recompute for r in range(len(ranked)))


def test_recompute_layers_round_trips_and_is_validated() -> None:
    text = "tp=8,pp=16,dp=64,vpp=4,mbs=1,recompute=full,zero=1,recompute_layers=1"
    plan = parse_parallel(text)
    assert plan.recompute_layers == 1 and plan.partial_recompute
    assert parse_parallel(plan.text()) == plan
    assert "recompute_layers" not in dataclasses.replace(plan, recompute_layers=0).text()
    model = load_model("llama3-405b")
    check_parallel(plan, model, 8192, 8192, 2048)
    with pytest.raises(ArgosyError, match="recompute=full"):
        check_parallel(dataclasses.replace(plan, recompute="selective"), model, 8192, 8192, 2048)
    with pytest.raises(ArgosyError, match="fewer than the 2 layers"):
        check_parallel(dataclasses.replace(plan, recompute_layers=2), model, 8192, 8192, 2048)
    with pytest.raises(ConfigError):
        parse_parallel("tp=8,recompute_layers=-1")


def test_estimate_suggests_recomputing_as_few_layers_as_fit() -> None:
    """`argosy estimate` of a layout over memory names the smallest fix; under a profile
    with the block method that is full recompute of the fewest layers that fit."""
    from argosy.planner.api import estimate

    model, cluster = load_model("llama3-405b"), load_cluster("h100:8192")
    plan = parse_parallel("tp=8,pp=16,dp=64,vpp=4,mbs=1,recompute=none,zero=2")
    out = estimate(model, cluster, plan, 8192, 2048, framework="megatron-core")
    assert out["feasible"] is False
    assert out["fix"].startswith("recompute=full, recompute_layers=1 fits"), out["fix"]
    titan = estimate(model, cluster, plan, 8192, 2048, framework="torchtitan")
    assert "recompute_layers" not in (titan.get("fix") or "")
