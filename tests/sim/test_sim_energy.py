"""The simulator's energy: catalog board power while allocated, a stated share of it
while idle, PUE on top; joules per delivered FLOP from the ledger."""

from __future__ import annotations

import pytest

from argosy.hardware.catalog import default_catalog
from argosy.hardware.loader import load_cluster
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.sim.energy import J_PER_MWH, energy_report
from argosy.sim.engine import Simulation
from argosy.sim.generate import generate


class Ledger:
    def __init__(self, productive: float, delivered: float) -> None:
        self.delivered = delivered
        self.productive = productive

    def factors(self):
        return {"effective_training_time": self.productive}


def test_energy_is_board_power_while_allocated_and_a_share_of_it_idle():
    tdp = {c: default_catalog().get(c).tdp_w for c in ("h100-sxm", "a100-80g")}
    seconds = {"h100-sxm": {"allocated": 3600.0, "no_work": 1800.0, "down": 1800.0},
               "a100-80g": {"allocated": 0.0, "blocked_whole": 7200.0}}  # fmt: skip
    e = energy_report(seconds, Ledger(0.9, 2e18), idle_fraction=0.1, pue=1.25)
    it = 3600 * tdp["h100-sxm"] + 3600 * 0.1 * tdp["h100-sxm"] + 7200 * 0.1 * tdp["a100-80g"]
    assert e["it_energy_mwh"] == pytest.approx(it / J_PER_MWH)
    assert e["facility_energy_mwh"] == pytest.approx(1.25 * it / J_PER_MWH)
    assert e["joules_per_pflop"] == pytest.approx(1.25 * it / 2000)
    assert e["useful_share"] == pytest.approx(0.9 * 3600 * tdp["h100-sxm"] / it)
    assert e["per_chip"]["a100-80g"]["allocated_mwh"] == 0.0


@pytest.mark.parametrize("policy", ["fifo", "argosy"])
def test_a_run_s_energy_lies_between_all_idle_and_all_busy(policy):
    cluster = load_cluster("h100:256")
    gen = generate(cluster, 1, seed=4)
    tree = build_tree(QueuesFile.model_validate(gen.queues), cluster)
    r = Simulation(cluster, tree, gen.records, policies.get(policy), seed=4).run()
    e = r["energy"]
    owned_s = cluster.num_devices * 86400
    tdp = default_catalog().get("h100-sxm").tdp_w
    assert 0.1 * tdp * owned_s < e["it_energy_mwh"] * J_PER_MWH < tdp * owned_s
    busy = e["per_chip"]["h100-sxm"]["allocated_mwh"] / e["it_energy_mwh"]
    assert 0 < e["useful_share"] <= busy + 1e-9  # productive time is a part of allocated
    factor = r["five_factor"]["energy_efficiency"]
    assert factor["value"] == pytest.approx(e["useful_share"] / 1.2)
    assert "tdp_w" in factor["how"] and "assumed" in factor["how"]
    assert e["joules_per_pflop"] > 0
