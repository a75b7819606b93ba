"""The trainer's idle OpenMP workers are ended before the persister copies a CPU snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from argosy.checkpoint import FlashCheckpointer, openmp
from argosy.checkpoint import flash as flash_module

_WORKERS = textwrap.dedent(
    """
    import json, os, torch
    from argosy.checkpoint.openmp import release_idle_workers
    torch.set_num_threads(3)
    a = torch.randn(1 << 22)
    count = lambda: len(os.listdir("/proc/self/task"))
    b = a * 2  # a parallel op: the pool's two workers now exist
    with_pool = count()
    released = release_idle_workers(torch.get_num_threads())
    after = count()
    c = a * 3  # a new pool for the next parallel op
    print(json.dumps({"with_pool": with_pool, "released": released, "after": after,
                      "again": count(), "right": bool(torch.equal(c, a * 3))
                      and bool(torch.equal(b, a * 2))}))
    """
)


def test_release_ends_the_pool_and_the_next_op_starts_a_new_one(ck):
    out = subprocess.run(
        [sys.executable, "-c", _WORKERS], capture_output=True, text=True, timeout=120,
        env=ck.env_with_repo() | {"OMP_NUM_THREADS": "3"}, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got["released"] is True
    assert got["after"] == got["with_pool"] - 2, got
    assert got["again"] == got["with_pool"], got
    assert got["right"]


def test_the_loaded_runtime_is_found():
    assert openmp.openmp_runtime() is not None
    assert "omp" in openmp.openmp_runtime()


def test_nothing_to_release_with_one_thread_or_no_runtime(monkeypatch):
    assert openmp.release_idle_workers(1) is False
    monkeypatch.setattr(openmp, "openmp_runtime", lambda: None)
    openmp._pause_call.cache_clear()
    try:
        assert openmp.release_idle_workers(4) is False
    finally:
        openmp._pause_call.cache_clear()


def test_a_cpu_save_releases_the_workers_before_it_asks_for_the_copy(tmp_path, job, ck,
                                                                      monkeypatch):  # fmt: skip
    calls: list[tuple[int, int | None]] = []
    state = ck.small_state()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(0, state)
        assert ckpt.wait() == 0  # the persister runs: every save now hands it a snapshot
        monkeypatch.setattr(
            flash_module, "release_idle_workers",
            lambda threads: calls.append((threads, ckpt._pending)) or True,
        )  # fmt: skip
        for step in range(1, 4):
            ckpt.save(step, state)
        assert ckpt.wait() == 3
    assert calls == [(torch.get_num_threads(), None)] * 3  # before each copy was asked for
