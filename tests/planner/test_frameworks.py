"""Framework profiles and measured tables: ZeRO semantics per framework, kernels, breakdown."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from argosy.cli.app import app
from argosy.core.errors import UnknownNameError
from argosy.hardware.loader import load_cluster
from argosy.planner.frameworks import FRAMEWORKS, known_frameworks, load_framework
from argosy.planner.measured import MEASURED_DIR, tables_for
from argosy.planner.models import load_model
from argosy.planner.parallel import Parallel
from argosy.planner.search import estimate_one

GPT = load_model("gpt3-175b")
runner = CliRunner()


def cost(plan, framework, cluster="h100:256", model=GPT, seq=2048, gbs=256):
    group = load_cluster(cluster).groups[0]
    return estimate_one(model, group, seq, gbs, plan, framework=framework)[0]


def test_every_profile_loads_with_sources_and_all_four_zero_stages() -> None:
    assert set(FRAMEWORKS) <= set(known_frameworks())
    for name in FRAMEWORKS:
        profile = load_framework(name)
        assert profile.sources, name
        assert sorted(profile.zero) == [0, 1, 2, 3], name


def test_unknown_framework_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="megatron-core"):
        load_framework("megatron-xl")
    result = runner.invoke(app, ["plan", "--framework", "megatron-xl", "--json"])
    assert result.exit_code == 2
    assert "deepspeed" in result.output and "Traceback" not in result.output


def test_distributed_optimizer_reduces_once_per_step_zero2_every_microbatch() -> None:
    """tp8/pp8/vpp6/dp4: Megatron's zero=2 DP time does not grow with micro-batches;
    DeepSpeed's ZeRO-2 reduces every micro-batch, so it grows with them."""

    def dp_time(framework: str, gbs: int, vpp: int) -> float:
        plan = Parallel(tp=8, pp=8, dp=4, vpp=vpp, mbs=1, recompute="selective", zero=2)
        return float(cost(plan, framework, gbs=gbs).dp_s[0])

    few, many = dp_time("megatron-core", 64, 6), dp_time("megatron-core", 512, 6)
    assert many == pytest.approx(few, rel=1e-9)
    ds_few, ds_many = dp_time("deepspeed", 64, 1), dp_time("deepspeed", 512, 1)
    assert ds_many > 4 * ds_few > 0


def test_overlap_makes_megatron_core_faster_than_2021_megatron_lm() -> None:
    """TP overlap halves the exposed TP time and the step is shorter. (Megatron-Core
    reduces gradients in fp32, twice the 2021 bytes: behind a short last backward its
    data-parallel part alone can be the longer one.)"""
    plan = Parallel(tp=8, pp=8, dp=4, vpp=6, mbs=1, recompute="selective", zero=1, flash=True)
    core, old = cost(plan, "megatron-core"), cost(plan, "megatron-lm")
    assert core.tp_s[0] < old.tp_s[0] and core.step_s[0] < old.step_s[0]


def test_compile_and_fp8_speed_up_torchtitan() -> None:
    model = load_model("llama3-8b")
    base = Parallel(tp=1, pp=1, dp=8, mbs=1, recompute="selective", zero=3)
    args = ("torchtitan", "h100:8", model, 8192, 64)
    eager = cost(base, *args).step_s[0]
    compiled = cost(Parallel(**{**base.as_dict(), "compile": True}), *args).step_s[0]
    fp8 = cost(Parallel(**{**base.as_dict(), "fp8": True}), *args).step_s[0]
    assert compiled < eager and fp8 < eager


def test_profiles_shard_what_they_say() -> None:
    plan = Parallel(tp=1, pp=1, dp=8, mbs=1, zero=3)
    model = load_model("llama3-8b")
    titan = cost(plan, "torchtitan", "h100:8", model, 4096, 8).memory
    unsharded = cost(Parallel(tp=1, pp=1, dp=8, mbs=1, zero=0), "pytorch", "h100:8", model, 4096, 8)
    assert titan.optimizer[0] * 8 == pytest.approx(8 * model.total_params(), rel=0.01)
    assert unsharded.memory.optimizer[0] == pytest.approx(4 * model.total_params(), rel=0.01)


@settings(max_examples=40, deadline=None)
@given(
    framework=st.sampled_from(FRAMEWORKS),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    mbs=st.sampled_from([1, 2]),
    compile_=st.booleans(),
)
def test_breakdown_adds_up_to_the_step(framework, tp, pp, zero, recompute, mbs, compile_) -> None:
    profile = load_framework(framework)
    vpp = 2 if pp > 1 and profile.interleaved_pipeline else 1
    dp = 64 // (tp * pp)
    plan = Parallel(
        tp=tp, pp=pp, dp=dp, vpp=vpp, mbs=mbs, recompute=recompute, zero=zero, compile=compile_
    )
    costs = cost(plan, framework, "h100:64", load_model("llama3-8b"), 4096, 256)
    parts = costs.breakdown(0)
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(float(costs.step_s[0]), rel=1e-9)


def test_gemm_curve_follows_the_measured_table() -> None:
    """The fitted curve stays close to the rows it was fitted on; the tables it reads ship
    with the package."""
    rows = [json.loads(line) for line in (MEASURED_DIR / "h100-sxm.jsonl").read_text().splitlines()]
    linear = [r for r in rows if r["kind"] == "linear" and "fwd_bwd_eff" in r]
    m = tables_for("h100-sxm")
    assert m is not None
    predicted = np.array([float(m.gemm_eff(r["m"], r["n"], r["k"])) for r in linear])
    measured = np.array([r["fwd_bwd_eff"] for r in linear])
    assert np.median(np.abs(predicted / measured - 1)) < 0.05
    big = float(m.gemm_eff(16384, 28672, 8192))
    assert 0.6 < big < 0.8 and float(m.gemm_eff(512, 2048, 2048)) < big
    assert 1.1 < m.fp8_factor < 2.2 and tables_for("910b") is None


def test_estimate_that_does_not_fit_exits_1_with_the_fix_in_the_output() -> None:
    result = runner.invoke(
        app,
        ["estimate", "-m", "llama3-70b", "-c", "h100:8", "-p", "tp=8,pp=1,dp=1,mbs=1,zero=0",
         "--seq-len", "8192", "--global-batch", "8"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "smallest fix" in result.output


def test_empty_cluster_is_a_usage_error() -> None:
    result = runner.invoke(app, ["plan", "--cluster", ""])
    assert result.exit_code == 2
    assert "--cluster is empty" in result.output and "Traceback" not in result.output


def test_estimate_json_has_breakdown_and_framework() -> None:
    result = runner.invoke(
        app,
        ["estimate", "-m", "gpt3-175b", "-c", "h100:256", "-f", "deepspeed", "--seq-len", "2048",
         "--global-batch", "512", "-p", "tp=8,pp=8,dp=4,mbs=1,recompute=full,zero=1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["framework"] == "deepspeed"
    assert out["parallel"]["flash"] is False  # the profile's default kernel
    parts = out["predicted"]["breakdown_s"]
    assert {"compute", "tp", "dp", "bubble", "optimizer", "recompute"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(out["predicted"]["step_time_s"], rel=1e-9)


H100_1B = "layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,gated=1"


def test_peak_memory_of_the_measured_h100_run() -> None:
    """reference/measured_h100.md: peaks span 27-62 GiB, and the estimate of the time
    (63.3 GiB for this shape) was 3% above its run's peak, so the 2048 x 8 eager run
    peaked at about 61.5-62 GiB (torch.cuda.max_memory_allocated)."""
    plan = Parallel(tp=1, pp=1, dp=1, mbs=8, recompute="none", zero=0, sp=False)
    costs = cost(plan, "pytorch", "h100:1", load_model(H100_1B), 2048, 16)
    allocated = float(costs.memory.allocated[0]) / 2**30
    assert allocated == pytest.approx(62.0, rel=0.10)
    compiled = Parallel(**{**plan.as_dict(), "compile": True})
    less = cost(compiled, "pytorch", "h100:1", load_model(H100_1B), 2048, 16)
    assert less.memory.allocated[0] < costs.memory.allocated[0]


def _plan_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_groups_of_one_chip_merge_into_one_layout() -> None:
    out = _plan_json("-m", "llama3-8b", "-c", "h100:64+h100:64", "--seq-len", "4096",
                     "--global-batch", "512")  # fmt: skip
    assert out["cluster"] == "h100-sxm:128"
    for entry in out["plans"]:
        p = entry["parallel"]
        assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == 128


def test_mixed_batch_shares_are_multiples_of_each_groups_dp() -> None:
    out = _plan_json("-m", "llama3-70b", "-c", "a100:1000+h100:512", "--seq-len", "4096",
                     "--global-batch", "2048", "--top", "3")  # fmt: skip
    splits = [entry for entry in out["plans"] if entry.get("split") == "batch"]
    assert splits, out  # 1,512 devices: a batch of 2048 gives each a sequence
    for entry in splits:
        shares = [g["batch_share"] for g in entry["groups"]]
        assert sum(shares) == 2048
        for group in entry["groups"]:
            if group["batch_share"]:
                assert group["batch_share"] % group["parallel"]["dp"] == 0, group


def test_device_count_that_does_not_factor_offers_fewer_devices_and_batches() -> None:
    result = runner.invoke(
        app, ["plan", "-m", "llama3-8b", "-c", "h100:1000", "--global-batch", "2048", "--json"]
    )
    out = json.loads(result.stdout)
    assert out["plans"] == [] and "reduce seq-len" not in out["fix"]
    alt = out["alternatives"]
    assert alt["devices"] < 1000 and alt["plans"]
    p = alt["plans"][0]["parallel"]
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == alt["devices"]
    assert 2048 % (p["dp"] * p["mbs"]) == 0
    assert alt["global_batches"] and all(b != 2048 for b in alt["global_batches"])


@pytest.mark.slow
def test_mixed_table_names_each_layouts_chip() -> None:
    result = runner.invoke(
        app, ["plan", "-m", "llama3-8b", "-c", "a100:32+h100:32", "--seq-len", "4096",
              "--global-batch", "256", "--top", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "tp" in line or "pp" in line]
    assert any(" a100 " in row for row in rows) and any(" h100 " in row for row in rows)


@settings(max_examples=25, deadline=None)
@given(
    framework=st.sampled_from(FRAMEWORKS),
    zero=st.integers(0, 3),
    nmb_factor=st.sampled_from([2, 4, 8]),
)
def test_once_per_step_traffic_does_not_grow_with_micro_batches(framework, zero, nmb_factor):
    """The framework's own ZeRO semantics decide: traffic reduced or gathered once per step
    is the same for 8 or 8 x k micro-batches; per-micro-batch traffic grows with them."""
    stage = load_framework(framework).stage(zero)
    plan = Parallel(tp=8, pp=1, dp=8, mbs=1, recompute="selective", zero=zero)
    args = (framework, "h100:64", load_model("llama3-70b"), 4096)
    few = float(cost(plan, *args, 64).dp_s[0])
    many = float(cost(plan, *args, 64 * nmb_factor).dp_s[0])
    assert few > 0
    if stage.grad_reduce == "step" and stage.param_gather in ("none", "step"):
        assert many == pytest.approx(few, rel=1e-9)
    else:
        assert many > few * 1.5


def test_fitting_recovers_known_scales() -> None:
    """Runs whose 'measured' times were made with known compute and comm scales (a cell of
    the fit's grids) are fitted back to them: the fit finds what generated the data."""
    from argosy.planner.calibration import COMM_GRID, COMPUTE_GRID, fit_group, points, predict
    from argosy.planner.frameworks import Scales

    truth = Scales(compute=COMPUTE_GRID[22], comm=COMM_GRID[5])
    chosen = [p for p in points() if p.source == "nemo-2407"]
    synthetic = [
        p.model_copy(update={"iteration_s": predict(p, scales=truth).predicted_s,
                             "tokens_per_s": None})
        for p in chosen
    ]  # fmt: skip
    fitted = fit_group(synthetic)
    assert (fitted.compute, fitted.comm) == (truth.compute, truth.comm)


def test_estimate_table_explains_the_time() -> None:
    result = runner.invoke(
        app,
        ["estimate", "-m", "gpt3-175b", "-c", "h100:256", "--seq-len", "2048",
         "--global-batch", "512", "-p", "tp=8,pp=8,dp=4,vpp=6,mbs=1,recompute=selective,zero=2"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for label in ("compute s", "exposed TP comm s", "exposed DP/ZeRO comm s", "pipeline bubble s"):
        assert label in result.output
    assert "megatron-core" in result.output and "%" in result.output
