"""Kill storms: random kills in save / persist / commit, real ranks, CPU contention.

After every restore (argosy.checkpoint.chaos.audit): all ranks resumed at the same step,
no older than the newest intact commit, with that step's exact state; every commit
verifies. `benchmarks/soak.py` runs the same storm at >= 1,000 faults.
"""

from __future__ import annotations

import os

import pytest

from argosy.checkpoint import faultpoints
from argosy.checkpoint.chaos import audit, run_storm
from argosy.checkpoint.segment import job_segments

SEED = int(os.environ.get("ARGOSY_RACE_SEED", "20261123"))


@pytest.mark.slow
def test_a_kill_storm_never_tears_a_commit_nor_splits_the_ranks(tmp_path):
    report = run_storm(tmp_path, faults=3, seed=SEED, busy=1)
    assert report.violations == []
    assert report.restores == 4  # every attempt (3 with a fault, a last one) restored, audited
    assert report.commits_verified >= 1
    assert report.resumed_steps[-1] > 0  # the storm made progress that survived it
    assert not [p for p in job_segments("storm-") if str(os.getpid()) in p.name]


def _resume(attempt: int, rank: int, step: int, intact: bool = True) -> dict:
    return {"attempt": attempt, "rank": rank, "step": step, "intact": intact}


@pytest.mark.parametrize(
    "resumes, newest_before, want",
    [
        ([_resume(1, 0, 10), _resume(1, 1, 10)], 10, []),
        ([_resume(1, 0, 15), _resume(1, 1, 15)], 10, []),  # newer, from memory
        ([_resume(1, 0, 10), _resume(1, 1, 5)], 5, ["ranks resumed apart"]),
        ([_resume(1, 0, 5), _resume(1, 1, 5)], 10, ["older than the newest intact commit"]),
        ([_resume(1, 0, 5), _resume(1, 1, 5, intact=False)], 5, ["is not step 5's"]),
        ([_resume(1, 0, 5)], 5, ["1 of 2 ranks"]),
    ],
    ids=["agreed", "newer-memory", "apart", "too-old", "wrong-bytes", "missing-rank"],
)
def test_the_audit_names_each_violation(resumes, newest_before, want):
    found = audit(resumes, world=2, newest_before=newest_before)
    assert len(found) == len(want)
    for problem, fragment in zip(found, want, strict=True):
        assert fragment in problem


def test_crash_points_are_the_documented_ones():
    want = ("copy", "write", "publish", "metadata", "commit", "renamed")
    assert want == faultpoints.POINTS  # the order a step passes them


def test_a_persister_fault_waits_for_the_victims_persister_to_be_ready(tmp_path):
    from argosy.checkpoint.chaos import Storm, _record

    storm = Storm(tmp_path, seed=1)
    _record(tmp_path, kind="resume", attempt=2, rank=1, step=5)
    assert not storm._ready(2, 1)  # resumed, persister still starting: no backstop yet
    _record(tmp_path, kind="ready", attempt=2, rank=0, step=6)
    assert not storm._ready(2, 1)
    _record(tmp_path, kind="ready", attempt=2, rank=1, step=7)
    assert storm._ready(2, 1) and not storm._ready(3, 1)
