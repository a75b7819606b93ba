"""Builders shared by the scheduler tests: small clusters, queue trees, workloads."""

from __future__ import annotations

import numpy as np

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler.core import Scheduler
from argosy.scheduler.invariants import violations
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.scheduler.workload import Workload


def tree_for(cluster, chip="h100", guarantee=0, a_nominal=None, a_ceiling=None):
    total = cluster.num_devices
    rest = total - guarantee
    a = {"nominal": a_nominal if a_nominal is not None else rest // 2}
    if a_ceiling is not None:
        a["ceiling"] = a_ceiling
    spec = {
        "queues": [
            {
                "name": "org",
                "children": [
                    {"name": "a", "quota": {chip: a}},
                    {"name": "b", "quota": {chip: {"nominal": rest - a["nominal"]}}},
                    {"name": "svc", "quota": {chip: {"guarantee": guarantee,
                                                     "ceiling": guarantee}}},
                ],
            }
        ]
    }  # fmt: skip
    return build_tree(QueuesFile.model_validate(spec), cluster)


def make(spec="h100:256", policy="argosy", **tree_kw):
    cluster = load_cluster(spec)
    clock = FakeClock()
    sched = Scheduler(cluster, tree_for(cluster, **tree_kw), policies.get(policy), clock=clock)
    return sched, clock


def job(wid, queue="a", devices=8, max_devices=None, priority=0, chips=("h100",),
        kind="train", submit=0.0) -> Workload:  # fmt: skip
    return Workload(wid, kind, queue, priority, tuple(chips), devices, max_devices or devices,
                    submit)  # fmt: skip


def service(wid, peak, profile=None) -> Workload:
    w = Workload(wid, "infer", "svc", 1000, ("h100",), 1, peak)
    w.profile = np.asarray(profile if profile is not None else [1.0])
    w.profile_step_s = 600.0
    return w


def check_invariants(sched) -> None:
    """Every rule of `argosy.scheduler.invariants` holds."""
    problems = violations(sched)
    assert problems == [], problems


def settle(sched, cycles=8):
    """Run cycles until nothing changes (policies may admit one head per queue per cycle)."""
    out = []
    for _ in range(cycles):
        step = sched.cycle()
        if not step:
            break
        out += step
    return out
