"""Mixture-of-experts and attention-width accounting: routed experts keep their optimizer
state and reduce their gradients over their own data-parallel group (dp*cp/ep ranks), and a
head width apart from hidden/heads widens the attention the cost model prices."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.hardware.loader import load_cluster
from argosy.planner.emit_deepspeed import deepspeed
from argosy.planner.emit_megatron import megatron
from argosy.planner.frameworks import load_framework
from argosy.planner.memory import GIB
from argosy.planner.models import load_model
from argosy.planner.parallel import Parallel
from argosy.planner.search import estimate_one

QWEN = load_model("qwen3-30b-a3b")
OSS = load_model("gpt-oss-120b")


def _costs(model, plan: Parallel, cluster: str = "h100:64", seq: int = 4096, gbs: int = 512):
    group = load_cluster(cluster).groups[0]
    costs, _ = estimate_one(model, group, seq, gbs, plan, framework="megatron-core")
    return costs


def _expert_params_per_stage(model, plan: Parallel) -> float:
    layers = -(-model.layers // plan.pp)
    return layers * model.mlp_mats * model.hidden * model.expert_ffn * model.experts / plan.tp


@settings(max_examples=20, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8, 16]), tp=st.sampled_from([1, 2]))
def test_expert_optimizer_state_is_sharded_over_the_expert_data_parallel_group(
    ep: int, tp: int
) -> None:
    """ZeRO-1 (distributed optimizer): each routed expert's 12 B of state per parameter
    is split over the dp*cp/ep ranks that hold that expert, so a device holds
    12 x (all experts of its stage) / (tp x dp) whatever ep is; the dense rest over dp."""
    plan = Parallel(tp=tp, pp=4, dp=16 // tp, ep=ep, mbs=1, recompute="full", zero=1)
    memory = _costs(OSS, plan).memory
    opt = memory.optimizer[0]
    all_params = memory.weights[0] / 2.0  # bf16 weights, unsharded under ZeRO-1
    experts_held = _expert_params_per_stage(OSS, plan) / ep
    dense = all_params - experts_held
    want = 12.0 * dense / plan.dp + 12.0 * experts_held / (plan.dp / ep)
    assert opt == pytest.approx(want, rel=1e-9)
    assert 12.0 * experts_held / (plan.dp / ep) == pytest.approx(
        12.0 * _expert_params_per_stage(OSS, plan) / plan.dp, rel=1e-9
    )


def test_expert_state_is_not_divided_by_all_data_parallel_ranks() -> None:
    """gpt-oss-120b at tp1 pp4 dp16 ep8: each expert lives on 2 ranks, so its 12 B/param
    of optimizer state is halved, not divided by 16: about 20 GiB of a stage's 3.6 B
    expert parameters, where dividing by dp would claim 2.5 GiB."""
    plan = Parallel(tp=1, pp=4, dp=16, ep=8, mbs=1, recompute="full", zero=1)
    opt_gib = _costs(OSS, plan).memory.optimizer[0] / GIB
    experts_gib = 12.0 * _expert_params_per_stage(OSS, plan) / 8 / 2 / GIB
    assert experts_gib > 19.0
    assert opt_gib == pytest.approx(experts_gib, rel=0.05)


def test_expert_gradients_reduce_over_fewer_ranks_as_ep_grows() -> None:
    """More expert parallelism: fewer expert parameters per device and a smaller group to
    reduce them over; at ep = dp no expert gradient leaves its device."""
    dp_s = [
        _costs(QWEN, Parallel(tp=1, pp=1, dp=16, ep=ep, mbs=1, recompute="full", zero=0)).dp_s[0]
        for ep in (1, 2, 4, 8, 16)
    ]
    assert all(a > b for a, b in zip(dp_s, dp_s[1:], strict=False)), dp_s


def test_a_wider_attention_costs_more_and_the_default_width_changes_nothing() -> None:
    plan = Parallel(tp=1, pp=4, dp=16, ep=8, mbs=1, recompute="full", zero=1)
    wide = _costs(OSS, plan).step_s[0]
    narrow = _costs(OSS.model_copy(update={"head_dim": 45}), plan).step_s[0]
    assert wide > narrow
    llama = load_model("llama3-8b")
    spelled = llama.model_copy(update={"head_dim": 128})
    dense = Parallel(tp=1, pp=1, dp=64, mbs=1, recompute="none", zero=1)
    assert _costs(llama, dense).step_s[0] == _costs(spelled, dense).step_s[0]


@pytest.mark.parametrize("emit", [megatron, deepspeed], ids=["megatron", "deepspeed"])
def test_a_head_width_apart_from_hidden_over_heads_is_emitted(emit) -> None:
    plan = Parallel(tp=1, pp=1, dp=64, ep=8, mbs=1, recompute="full", zero=1)
    text = emit(plan, OSS, seq_len=4096, global_batch=512)
    assert "--kv-channels 64" in text
    dense = emit(
        Parallel(tp=1, pp=1, dp=64, mbs=1, recompute="full", zero=1),
        load_model("llama3-8b"),
        seq_len=4096,
        global_batch=512,
    )
    assert "--kv-channels" not in dense


def test_routing_work_grows_with_tokens_times_local_experts() -> None:
    """The fitted routing term adds tokens x local experts x its ns per layer: halving the
    experts a device holds halves it, doubling the micro-batch doubles it; without MoE (or
    with the term at 0) it adds nothing."""
    group = load_cluster("h100:16").groups[0]
    with_term = load_framework("megatron-core")
    assert with_term.moe_token_expert_ns > 0
    without = with_term.model_copy(update={"moe_token_expert_ns": 0.0})

    def added(ep: int, mbs: int) -> float:
        plan = Parallel(tp=1, pp=1, dp=16, ep=ep, mbs=mbs, recompute="none", zero=1)
        one = [
            estimate_one(QWEN, group, 4096, 512, plan, framework=f)[0].compute_s[0]
            for f in (with_term, without)
        ]
        return one[0] - one[1]

    assert added(4, 1) == pytest.approx(2 * added(8, 1), rel=1e-6)
    assert added(8, 2) == pytest.approx(added(8, 1), rel=1e-6)  # same tokens per step
    llama = load_model("llama3-8b")
    dense = Parallel(tp=1, pp=1, dp=16, mbs=1, recompute="none", zero=1)
    steps = [
        estimate_one(llama, group, 4096, 512, dense, framework=f)[0].step_s[0]
        for f in (with_term, without)
    ]
    assert steps[0] == steps[1]
