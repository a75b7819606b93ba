"""The five-factor accounting: four factors that multiply to delivered / owned FLOPs."""

import pytest

from argosy.hardware.loader import load_cluster
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.plans import PlanCosts
from argosy.sim.trace import TraceRecord

DAY = 86400.0


def one_job(policy, plans="planner", devices=8, cluster="h100:16", work_s=DAY / 2):
    c = load_cluster(cluster)
    chip = next(iter(c.devices_by_chip()))
    tree = build_tree(QueuesFile.model_validate({"queues": [{"name": "t"}]}), c)
    record = TraceRecord(id="j", submit_s=0.0, kind="finetune", queue="t", chips=[chip],
                         devices=devices, work_device_s=devices * work_s)  # fmt: skip
    sim = SimConfig(faults=False, plans=plans)
    return Simulation(c, tree, [record], policies.get(policy), horizon_s=DAY, sim=sim).run()


def test_one_job_half_the_day_on_half_the_cluster():
    r = one_job("quota")
    f = {k: v["value"] for k, v in r["five_factor"].items()}
    assert f["resource_utilization"] == pytest.approx(0.25, rel=1e-6)
    assert f["effective_training_time"] == pytest.approx(1.0)
    want_mfu, want_scaling = PlanCosts().efficiency("llama3-8b", "h100-sxm", 8, stock=True)
    assert f["single_chip_efficiency"] == pytest.approx(want_mfu)
    assert f["parallel_scaling"] == pytest.approx(want_scaling)
    assert f["product"] == pytest.approx(0.25 * want_mfu * want_scaling)


def test_planner_plans_for_argosy_only_unless_stock_is_asked():
    planner = PlanCosts().efficiency("llama3-8b", "h100-sxm", 64, stock=False)
    stock = PlanCosts().efficiency("llama3-8b", "h100-sxm", 64, stock=True)
    assert planner[0] * planner[1] > stock[0] * stock[1]  # the planner beats the recipe
    argosy = one_job("argosy", devices=64, cluster="h100:256")
    argosy_stock = one_job("argosy", plans="stock", devices=64, cluster="h100:256")
    quota = one_job("quota", devices=64, cluster="h100:256")
    mfu = {name: r["five_factor"]["single_chip_efficiency"]["value"] * r["five_factor"][
        "parallel_scaling"]["value"] for name, r in
        (("argosy", argosy), ("stock", argosy_stock), ("quota", quota))}  # fmt: skip
    assert mfu["argosy"] == pytest.approx(planner[0] * planner[1])
    assert mfu["stock"] == pytest.approx(mfu["quota"]) == pytest.approx(stock[0] * stock[1])
    assert argosy["plans"] == "planner" and argosy_stock["plans"] == "stock"


def test_mixed_cluster_weighs_devices_by_peak_flops():
    # 8 devices of the slower chip busy all day: a small share of the cluster's FLOPs
    r = one_job("quota", cluster="a100-80g:16+h100:16", work_s=10 * DAY)
    a100, h100 = 312.0, 989.0
    want = 8 * a100 / (16 * a100 + 16 * h100)
    assert r["five_factor"]["resource_utilization"]["value"] == pytest.approx(want, rel=1e-3)


def test_a_better_plan_finishes_the_same_work_sooner():
    planner = one_job("argosy", devices=64, cluster="h100:256", work_s=DAY / 4)
    stock = one_job("argosy", plans="stock", devices=64, cluster="h100:256", work_s=DAY / 4)
    want_planner = PlanCosts().efficiency("llama3-8b", "h100-sxm", 64, stock=False)
    want_stock = PlanCosts().efficiency("llama3-8b", "h100-sxm", 64, stock=True)
    speedup = (want_planner[0] * want_planner[1]) / (want_stock[0] * want_stock[1])
    jct = {name: r["jct_s"]["finetune"]["p50"] - r["queue_s"]["finetune"]["p50"]
           for name, r in (("planner", planner), ("stock", stock))}  # fmt: skip
    assert jct["stock"] == pytest.approx(DAY / 4)  # the trace's unit: stock plan on an H100
    assert jct["stock"] / jct["planner"] == pytest.approx(speedup, rel=1e-6)


def test_a_slower_chip_takes_longer_by_its_delivered_flops():
    r = one_job("quota", cluster="a100-80g:16", work_s=DAY / 8)
    a100 = PlanCosts().efficiency("llama3-8b", "a100-80g", 8, stock=True)
    h100 = PlanCosts().efficiency("llama3-8b", "h100-sxm", 8, stock=True)
    ratio = (989.0 * h100[0] * h100[1]) / (312.0 * a100[0] * a100[1])
    assert r["jct_s"]["finetune"]["p50"] == pytest.approx(DAY / 8 * ratio, rel=1e-3)
