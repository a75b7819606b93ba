"""benchmarks/sim.py `left`: the work a run leaves undone at its horizon, in the product's
points, so that product + left is every offered job's work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from argosy.hardware.loader import load_cluster
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.plans import PlanCosts
from argosy.sim.trace import TraceRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sim_left import left_at_horizon  # noqa: E402

DAY = 86400.0


def _run(jobs: dict[str, float]) -> tuple[Simulation, dict]:
    """Fine-tuning jobs of 8 h100 each (work: days of 8 devices) on 16, for one day."""
    cluster = load_cluster("h100:16")
    tree = build_tree(QueuesFile.model_validate({"queues": [{"name": "t"}]}), cluster)
    records = [
        TraceRecord(
            id=name,
            submit_s=0.0,
            kind="finetune",
            queue="t",
            chips=["h100-sxm"],
            devices=8,
            work_device_s=8 * days * DAY,
        )  # fmt: skip
        for name, days in jobs.items()
    ]
    sim = Simulation(cluster, tree, records, policies.get("quota"), horizon_s=DAY,
                     sim=SimConfig(faults=False, plans="stock"))  # fmt: skip
    return sim, sim.run()


def test_a_job_cut_by_the_horizon_is_left_with_the_rest_of_its_work():
    sim, report = _run({"long": 3.0, "short": 0.5})
    mfu, scaling = PlanCosts().efficiency("llama3-8b", "h100-sxm", 8, stock=True)
    rows = left_at_horizon(sim)
    assert [(r["state"], r["kind"], r["chips"], r["jobs"]) for r in rows] == [
        ("running", "finetune", "h100-sxm", 1)  # the short job finished: not listed
    ]
    # 2 of its 3 days of 8 devices are left, over 16 devices for a day
    assert rows[0]["product_points"] == pytest.approx(2 * 8 / 16 * mfu * scaling, rel=1e-3)
    done = report["five_factor"]["product"]["value"]
    assert done + rows[0]["product_points"] == pytest.approx(3.5 * 8 / 16 * mfu * scaling, rel=1e-3)


def test_nothing_is_left_when_every_job_finished():
    sim, _ = _run({"a": 0.25, "b": 0.5})
    assert left_at_horizon(sim) == []
