"""Shared pieces of the checkpoint tests: a unique job id per test and a /dev/shm check."""

from __future__ import annotations

import os
import uuid

import pytest

from argosy.checkpoint.segment import job_segments


@pytest.fixture
def job() -> str:
    """A job id of its own, so parallel tests never share shared-memory segments."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    leftover = job_segments(name)
    for path in leftover:
        path.unlink(missing_ok=True)
    assert not leftover, f"shared memory left behind: {[p.name for p in leftover]}"


from ckpt_helpers import assert_same, env_with_repo, small_state  # noqa: E402


class Helpers:
    small_state = staticmethod(small_state)
    assert_same = staticmethod(assert_same)
    env_with_repo = staticmethod(env_with_repo)
    trainer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer.py")


@pytest.fixture
def ck() -> type[Helpers]:
    return Helpers
