"""The idle breakdown: every owned device-second lands in exactly one category, and each
category is the one the scheduler's state says."""

import sys
from pathlib import Path

import pytest

from argosy.sim.idle import CATEGORIES, IdleBreakdown, total_share

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
from sched_helpers import job, make  # noqa: E402


def shares(sched, step_s=600.0):
    idle = IdleBreakdown(sched)
    idle.sample(sched, step_s)
    return idle.report()["all"]


def test_empty_cluster_has_no_work():
    sched, _ = make("h100:64", policy="quota")
    want = dict.fromkeys(CATEGORIES, 0.0) | {"no_work": 1.0}
    assert shares(sched) == pytest.approx(want)


def test_a_gang_that_does_not_fit_blocks_the_free_nodes():
    sched, _ = make("h100:64", policy="quota", a_nominal=64)
    sched.submit(job("small", devices=20))
    sched.cycle()
    sched.submit(job("big", devices=64))
    sched.cycle()
    got = shares(sched)
    # 20 devices held: two whole nodes and four devices of a third; the big gang waits
    assert got["allocated"] == pytest.approx(20 / 64)
    assert got["blocked_frag"] == pytest.approx(4 / 64)
    assert got["blocked_whole"] == pytest.approx(40 / 64)
    assert total_share({"all": got}) == pytest.approx(1.0)


def test_an_elastic_job_below_its_ceiling_marks_idle_as_growth_held():
    sched, _ = make("h100:64", policy="argosy", a_nominal=64)
    sched.submit(job("elastic", devices=16, max_devices=32))
    sched.cycle()
    got = shares(sched)
    held = sched.running["elastic"].devices
    assert got["allocated"] == pytest.approx(held / 64)
    assert got["growth_held"] + got["hot_spares"] == pytest.approx(1 - held / 64)


def test_down_and_spare_nodes_are_their_own_categories():
    sched, _ = make("h100:256", policy="argosy")
    sched.cycle()  # holds hot spares
    spares = int(sched.cap.spare_count.sum())
    assert spares >= 1
    sched.cap.mark_down(int(next(n for n in range(32) if not sched.cap.spare[n])))
    got = shares(sched)
    assert got["down"] == pytest.approx(8 / 256)
    assert got["hot_spares"] == pytest.approx(8 * spares / 256)
