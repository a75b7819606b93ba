"""A trainer that closes after a newer attempt raised the fence, with snapshots its
persister never made durable: those stay in memory for the newer attempt to load."""

from __future__ import annotations

import subprocess

import pytest
import torch
from held_trainer import late_popen

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint.flash import reclaim

PERSISTER_DELAY_S = 2.0
"""The persister starts this late: both saves are held by the trainer itself."""


def _late_persisters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "Popen", late_popen(PERSISTER_DELAY_S))


def test_a_fenced_close_leaves_held_snapshots_to_the_newer_attempt(tmp_path, job, monkeypatch):
    _late_persisters(monkeypatch)
    old = FlashCheckpointer(tmp_path, keep=2, job_id=job, linger_s=5)
    new = None
    try:
        w = torch.zeros(64, 1024)
        for step in range(2):
            w += 1
            old.save(step, {"w": w, "step": step})
        assert not old._ready, "the persister answered before the saves: nothing was held"
        new = FlashCheckpointer(tmp_path, keep=2, job_id=job, prestart=False)  # fences `old`
        assert new.epoch > old.epoch
        old.close()  # hands the held slots over; its persister is fenced before it persists
        got = new.load()
        assert got is not None, f"the held snapshots were lost: {new.last_decision}"
        assert (got[0], new.last_load_source) == (1, "memory")
        assert float(got[1]["w"][0, 0]) == 2.0
    finally:
        old.close()
        if new is not None:
            new.close()
        reclaim(job)  # `new` started no persister to adopt and free them
