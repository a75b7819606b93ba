"""The cost model's physics: each knob moves time and memory the way it must."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.hardware.loader import load_cluster
from argosy.planner.calibration import narayanan_flops
from argosy.planner.frameworks import load_framework
from argosy.planner.models import load_model
from argosy.planner.parallel import Parallel
from argosy.planner.search import estimate_one

GPT = load_model("gpt3-175b")


def cost(
    plan: Parallel,
    cluster: str = "a100:1536",
    model=GPT,
    seq: int = 2048,
    gbs: int = 1536,
    nic=None,
    framework=None,
):
    group = load_cluster(cluster, nic_gbps=nic).groups[0]
    costs, _ = estimate_one(model, group, seq, gbs, plan, framework=framework)
    return costs


BASE = Parallel(tp=8, pp=16, dp=12, mbs=1, recompute="selective", zero=1)


def test_hardware_flops_with_full_recompute_equal_narayanan_formula() -> None:
    costs = cost(Parallel(tp=8, pp=16, dp=12, recompute="full", zero=1))
    assert costs.hardware_flops[0] == pytest.approx(narayanan_flops(GPT, 2048, 1536), rel=1e-9)
    assert costs.hardware_flops[0] / costs.model_flops[0] == pytest.approx(4 / 3, rel=0.01)


@pytest.mark.parametrize(
    ("slower", "faster"),
    [
        (Parallel(tp=8, pp=16, dp=12, recompute="full", zero=1), BASE),
        (Parallel(tp=8, pp=16, dp=12, recompute="selective", zero=1, sp=False), BASE),
    ],
    ids=["full-recompute-costs-time", "no-sp-costs-time"],
)
def test_time_ordering(slower: Parallel, faster: Parallel) -> None:
    assert cost(slower).step_s[0] > cost(faster).step_s[0]


def test_recompute_trades_time_for_memory() -> None:
    times, mems = [], []
    for rec in ("none", "selective", "full"):
        c = cost(Parallel(tp=8, pp=16, dp=12, recompute=rec, zero=1, flash=False))
        times.append(c.step_s[0])
        mems.append(c.memory.activations[0])
    assert times[0] <= times[1] < times[2]
    assert mems[0] > mems[1] > mems[2]


def test_zero_stages_shrink_memory_monotonically() -> None:
    def totals(framework: str) -> list[float]:
        return [
            cost(Parallel(tp=8, pp=16, dp=12, zero=z), framework=framework).memory_gib[0]
            for z in range(4)
        ]

    ds = totals("deepspeed")  # each stage shards one more state
    assert all(a > b for a, b in zip(ds, ds[1:], strict=False))
    mcore = totals("megatron-core")  # distributed optimizer: zero=2 keeps the grad buffer
    assert mcore[0] > mcore[1] == mcore[2] > mcore[3]


def test_interleaving_shrinks_the_bubble() -> None:
    plain = cost(Parallel(tp=8, pp=16, dp=12, vpp=1))
    inter = cost(Parallel(tp=8, pp=16, dp=12, vpp=3))
    assert inter.bubble_s[0] < plain.bubble_s[0] * 0.5


def test_tensor_parallel_across_nodes_is_prohibitive() -> None:
    model = load_model("llama3-70b")
    inside = cost(Parallel(tp=8, pp=1, dp=8, zero=1), "h100:64", model, 4096, 64)
    across = cost(Parallel(tp=8, pp=1, dp=8, zero=1), "h100-pcie:64", model, 4096, 64)
    assert across.tp_s[0] > 3 * inside.tp_s[0]


def test_slower_network_slows_zero3_most() -> None:
    z3 = Parallel(tp=1, pp=1, dp=1536, mbs=1, recompute="full", zero=3)
    ptd = Parallel(tp=8, pp=12, dp=16, mbs=1, recompute="full", zero=1)
    z3_ratio = cost(z3, nic=50).step_s[0] / cost(z3).step_s[0]
    ptd_ratio = cost(ptd, nic=50).step_s[0] / cost(ptd).step_s[0]
    assert z3_ratio > 2 and ptd_ratio < 1.2


def test_last_stage_memory_includes_lm_head_logits_for_big_vocab() -> None:
    c = cost(
        Parallel(tp=1, pp=1, dp=64, mbs=1, zero=1), "h100:64", load_model("llama3-8b"), 8192, 64
    )
    per_vocab = load_framework("megatron-core").memory.logits_bytes_per_vocab
    assert c.memory.logits[0] == pytest.approx(per_vocab * 8192 * 128256, rel=1e-6)


def test_tensor_parallel_one_has_no_tp_traffic_and_more_dp_traffic() -> None:
    model = load_model("llama3-8b")
    tp1 = cost(Parallel(tp=1, pp=1, dp=64, zero=1), "h100:64", model, 8192, 512)
    tp8 = cost(Parallel(tp=8, pp=1, dp=8, zero=1), "h100:64", model, 8192, 512)
    assert tp1.tp_s[0] == 0 and tp8.tp_s[0] > 0
    assert np.isfinite(tp1.step_s[0]) and tp1.step_s[0] < tp8.step_s[0]


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([2, 4, 8]))
def test_data_parallel_traffic_leaves_the_node_when_its_group_does(tp: int, dp: int) -> None:
    """A data-parallel group's members are a TP group apart: with tp x dp devices over one
    node's 8, its gradients cross the NIC, however few replicas there are. A faster NIC
    then shortens the reduction exactly when the group leaves the node."""
    model = load_model("llama3-8b")
    plan = Parallel(tp=tp, pp=1, dp=dp, zero=0, mbs=1)
    n = tp * dp
    slow, fast = (cost(plan, f"h100:{n}", model, 4096, dp, nic=nic) for nic in (100, 3200))
    assert slow.dp_s[0] > 0
    if n <= 8:
        assert slow.dp_s[0] == pytest.approx(fast.dp_s[0], rel=1e-9)
    else:
        assert slow.dp_s[0] > 2 * fast.dp_s[0]


def test_ring_latency_follows_nccl_steps_inside_and_between_nodes() -> None:
    """NCCL's model: a base plus one latency per ring step, network steps dearer than
    NVLink ones; 1,536 ranks on 192 nodes wait about 6.4 ms per all-gather."""
    from argosy.planner.costmodel import Hardware, _ring_latency_s

    hw = Hardware.of(load_cluster("a100:1536").groups[0])
    one_node = _ring_latency_s(hw, np.array([8.0]), 1.0)[0]
    assert one_node == pytest.approx((8.4 + 7 * 3.4) * 1e-6)
    big = _ring_latency_s(hw, np.array([1536.0]), 1.0)[0]
    assert big == pytest.approx((8.4 + 1344 * 3.4 + 191 * 9.6) * 1e-6)
    spread = _ring_latency_s(hw, np.array([8.0]), 1.0, stride=8)[0]  # one rank per node
    assert spread == pytest.approx((8.4 + 7 * 9.6) * 1e-6)
    assert _ring_latency_s(hw, np.array([8.0]), 2.0)[0] > one_node  # an all-reduce: twice


@pytest.mark.parametrize("dp", [384, 768, 1536])
def test_zero3_per_layer_gathers_pay_latency_that_grows_with_replicas(dp: int) -> None:
    """ZeRO-3 moves the same bytes per device at any data-parallel size, but DeepSpeed
    gathers one submodule at a time: more replicas, longer rings, a longer step."""
    plan = Parallel(tp=1, pp=1, dp=dp, mbs=1536 // dp, recompute="full", zero=3)
    here = cost(plan, f"a100:{dp}", framework="deepspeed")
    twice = cost(
        Parallel(tp=1, pp=1, dp=2 * dp, mbs=1536 // dp, recompute="full", zero=3),
        f"a100:{2 * dp}",
        gbs=3072,
        framework="deepspeed",
    )
    assert twice.dp_s[0] > 1.02 * here.dp_s[0]  # log-latency rings: +0.1%
