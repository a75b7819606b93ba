"""The shared-host-memory transport (argosy.runtime.mixed.shm) in real processes: sums
equal gloo's, segments leave no file in /dev/shm, a dead or absent peer raises."""

from __future__ import annotations

import os
import subprocess

import pytest
import shm_workers
from test_mixed_allreduce import _run

from argosy.runtime.mixed.shm import PREFIX, SHM_DIR, sweep_stale


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{PREFIX}*")}


@pytest.mark.integration
@pytest.mark.slow
def test_shm_sums_files_and_peer_failures_in_one_spawn() -> None:
    """3 ranks: all-reduce equals gloo's exactly (6 dtype/size cases x 2 chunk sizes)
    and a one-way copy arrives whole; no segment file exists while mapped nor after; an
    absent peer times out, a dead one is named within a check period."""
    before = _segments()
    results = _run(shm_workers.suite, 3)
    sums = [r for r in results if r[0] == "sum"]
    assert len(sums) == 3 * 2 * 6
    bad = [(rank, case) for _, rank, case, exact in sums if not exact]
    assert not bad, f"shared-memory sums differ from gloo's: {bad}"
    assert [r[1:] for r in results if r[0] == "copy"] == [(2, True)]
    for _, rank, names in (r for r in results if r[0] == "files"):
        assert not set(names) - before, f"rank {rank} saw a mapped segment's file: {names}"
    idle = {r[1]: r[2:] for r in results if r[0] == "idle"}
    dead = {r[1]: r[2:] for r in results if r[0] == "exit"}
    assert sorted(idle) == sorted(dead) == [0, 1]
    for rank, (seconds, message) in idle.items():
        assert "did not reach" in message and "[2]" in message, (rank, message)
        assert 0.9 < seconds < 5.0, (rank, seconds)
    for rank, (seconds, message) in dead.items():
        assert "rank 2" in message and "died" in message, (rank, message)
        assert seconds < 5.0, (rank, seconds)
    assert _segments() <= before


def test_sweep_removes_only_files_of_dead_creators() -> None:
    """A creator killed between creating and unlinking leaves `argosy-ar-<pid>-...`:
    the sweep removes it, and keeps a live creator's file."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = SHM_DIR / f"{PREFIX}{gone.pid}-test"
    live = SHM_DIR / f"{PREFIX}{os.getppid()}-test"
    for path in (dead, live):
        path.write_bytes(b"x")
    try:
        removed = sweep_stale()
        assert dead.name in removed and not dead.exists()
        assert live.exists() and live.name not in removed
    finally:
        for path in (dead, live):
            path.unlink(missing_ok=True)
