"""FlashCheckpointer end to end in one process: save, memory and disk restore, DCP, pruning."""

from __future__ import annotations

import copy

import pytest
import torch

from argosy.checkpoint import CheckpointMismatchError, FlashCheckpointer
from argosy.checkpoint import disk as ckdisk
from argosy.checkpoint.segment import job_segments


@pytest.mark.slow
def test_save_then_load_from_memory_then_from_disk(tmp_path, job, ck):
    state = ck.small_state()
    want = copy.deepcopy(state)
    with FlashCheckpointer(tmp_path, keep=2, job_id=job) as ckpt:
        for step in range(4):
            ckpt.save(step, state)
        assert ckpt.wait() == 3
        step, got = ckpt.load()
        assert (step, ckpt.last_load_source) == (3, "memory")
        ck.assert_same(got, want)
        assert job_segments(job), "snapshots live in shared memory while open"
    assert not job_segments(job), "close() frees shared memory"
    assert len(ckdisk.committed_steps(tmp_path)) <= 2
    with FlashCheckpointer(tmp_path, keep=2, job_id=job) as again:
        step, got = again.load()
        assert (step, again.last_load_source) == (3, "disk")
        ck.assert_same(got, want)


def test_a_saved_step_reads_with_dcp(tmp_path, job, ck):
    import torch.distributed.checkpoint as dcp

    state = ck.small_state()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(7, state)
        ckpt.wait()
    target = ck.small_state(seed=1)
    dcp.load(target, checkpoint_id=str(tmp_path / ckdisk.step_dir_name(7)), no_dist=True)
    ck.assert_same(target, state)


def test_a_durable_save_reports_when_its_copy_write_and_commit_happened(tmp_path, job, ck):
    import time

    state = ck.small_state()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        for step in (1, 2):  # the first may be held aside while the persister starts
            before = time.monotonic()
            ckpt.save(step, state)
            ckpt.wait()
            after = time.monotonic()
            assert ckpt.last_write is not None
            started, written, committed = ckpt.last_write
            assert before <= started <= written <= committed <= after
        assert ckpt.last_copy_end is not None and ckpt.last_copy_s is not None
        assert before <= ckpt.last_copy_end <= after  # the second: copied by the persister
        assert 0 < ckpt.last_copy_s <= after - before


def test_load_into_fills_the_given_tensors_in_place(tmp_path, job, ck):
    state = ck.small_state()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        target = ck.small_state(seed=5)
        weight = target["model"]["0.weight"]
        step, got = ckpt.load(into=target)
    assert step == 1 and got["model"]["0.weight"] is weight
    assert torch.equal(weight, state["model"]["0.weight"])


def test_save_returns_before_the_copy_and_the_fence_waits_for_it(tmp_path, job):
    big = {"w": torch.randn(4096, 4096)}  # 64 MiB
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(0, big)
        ckpt.before_optimizer_step()
        before = big["w"].clone()
        ckpt.save(1, big)
        ckpt.before_optimizer_step()
        big["w"].add_(1.0)  # the optimizer step: after the fence it must not leak into step 1
        step, got = ckpt.load()
    assert step == 1 and torch.equal(got["w"], before)


@pytest.fixture(scope="module")
def saved_once(tmp_path_factory):
    """One checkpointer with one durable step, shared by the mismatch cases."""
    import uuid

    from ckpt_helpers import small_state

    job = f"test-{uuid.uuid4().hex[:10]}"
    ckpt = FlashCheckpointer(tmp_path_factory.mktemp("ckpt"), job_id=job)
    ckpt.save(1, small_state())
    ckpt.wait()
    yield ckpt
    ckpt.close()
    assert not job_segments(job)


@pytest.mark.parametrize(
    "change, want_text",
    [
        (lambda s: s["model"].pop("0.bias"), "not in the state to load into: model.0.bias"),
        (
            lambda s: s["model"].__setitem__("0.weight", torch.zeros(3, 3)),
            r"model.0.weight: shape \[128, 64\] in checkpoint, \[3, 3\] wanted",
        ),
        (
            lambda s: s["model"].__setitem__("0.weight", torch.zeros(128, 64, dtype=torch.float64)),
            "dtype torch.float32 in checkpoint, torch.float64 wanted",
        ),
        (
            lambda s: s["model"].__setitem__("new.weight", torch.zeros(2)),
            "missing in checkpoint: model.new.weight",
        ),
    ],
    ids=["missing-key", "shape", "dtype", "extra-key"],
)
def test_a_state_that_does_not_match_is_refused_with_the_list(saved_once, ck, change, want_text):
    target = ck.small_state()
    change(target)
    before = {k: v.clone() for k, v in target["model"].items()}
    with pytest.raises(CheckpointMismatchError, match=want_text):
        saved_once.load(into=target)
    ck.assert_same(target["model"], before)  # nothing half-loaded


def test_latest_step_and_nothing_to_load(tmp_path, job, ck):
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        assert ckpt.latest_step() is None and ckpt.load() is None
        ckpt.save(5, ck.small_state())
        ckpt.before_optimizer_step()
        assert ckpt.latest_step() == 5
        assert ckpt.load(step=4) is None


def test_a_state_whose_objects_grow_a_little_keeps_its_slots(tmp_path, job):
    """A slot that still holds the snapshot is kept: a state whose logged objects grow by
    a few KB a step must not pay a new slot (~1.5 s a GB to allocate) every few steps.
    Growth past the slots' room gets new ones, and the saves stay good."""
    import os

    from argosy.checkpoint.segment import segment_paths

    state = {"w": torch.rand(1 << 18), "log": []}
    with FlashCheckpointer(tmp_path, keep=2, job_id=job, slots=2) as ckpt:
        ckpt.save(0, state)
        ckpt.wait()
        inodes = {p.name: os.stat(p).st_ino for p in segment_paths(job, 0)}
        assert len(inodes) == 2
        for step in range(1, 7):
            state["log"].append(os.urandom(15_000).hex())  # the snapshot grows ~60 KB
            ckpt.save(step, state)
            ckpt.wait()
            assert {p.name: os.stat(p).st_ino for p in segment_paths(job, 0)} == inodes
        state["log"].append(os.urandom(1 << 20).hex())  # past the room to spare
        ckpt.save(7, state)
        ckpt.wait()
        assert {p.name: os.stat(p).st_ino for p in segment_paths(job, 0)} != inodes
        step, got = ckpt.load()
    assert step == 7 and got["log"] == state["log"] and torch.equal(got["w"], state["w"])
