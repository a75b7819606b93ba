"""The accelerator path: device tensors are staged through pinned, shared host buffers."""

from __future__ import annotations

import time

import pytest
import torch

from argosy.checkpoint import FlashCheckpointer

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def test_device_state_round_trips_and_the_fence_protects_it(tmp_path, job):
    dev = torch.device("cuda")
    state = {"w": torch.randn(4096, 4096, device=dev), "b": torch.randn(16, device=dev), "pos": 3}
    want = state["w"].cpu()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(1, state)
        ckpt.before_optimizer_step()
        state["w"].add_(1)  # after the fence: must not reach step 1
        step, got = ckpt.load()
        assert step == 1 and torch.equal(got["w"].cpu(), want) and got["pos"] == 3
        into = {"w": torch.zeros_like(state["w"]), "b": torch.zeros_like(state["b"]), "pos": 0}
        ckpt.load(into=into)
        assert same_device(into["w"].device, state["w"].device)
        assert torch.equal(into["w"].cpu(), want)


def same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` name one device when 0 is the current one: compare type and the
    resolved index, never the device objects (torch.device("cuda") != torch.device("cuda:0"))."""
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return a.type == b.type and (a.index if a.index is not None else current) == (
        b.index if b.index is not None else current
    )


def test_same_device_resolves_the_current_index() -> None:
    assert same_device(torch.device("cuda"), torch.device(f"cuda:{torch.cuda.current_device()}"))
    assert not same_device(torch.device("cuda:0"), torch.device("cpu"))


def test_snapshot_throughput_from_device_memory(tmp_path, job):
    """Prints GB/s of the device-to-pinned-host copy (target: >= 20 GB/s per GPU)."""
    dev = torch.device("cuda")
    state = {f"t{i}": torch.randn(64 << 20, device=dev) for i in range(8)}  # 2 GiB
    gib = sum(t.numel() * 4 for t in state.values()) / 2**30
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(0, state)
        ckpt.before_optimizer_step()
        times = []
        for step in range(1, 4):
            ckpt.wait()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ckpt.save(step, state)
            ckpt.before_optimizer_step()
            times.append(time.perf_counter() - t0)
    rate = gib / sorted(times)[1]
    print(f"device snapshot: {gib:.1f} GiB at {rate:.1f} GiB/s")
    assert rate > 1.0


def test_first_saves_of_device_state_are_held_while_the_persister_starts(tmp_path, job):
    """A restarted rank's first saves never wait for the persister's start-up."""
    dev = torch.device("cuda")
    state = {"w": torch.randn(1024, 1024, device=dev), "pos": 0}
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        t0 = time.perf_counter()
        ckpt.save(1, state)
        held = time.perf_counter() - t0
        assert not ckpt._ready and ckpt._held, "the save waited for the persister"
        state["w"].add_(1)
        want = state["w"].cpu()
        ckpt.save(2, state)
        assert ckpt.wait() == 2
        step, got = ckpt.load() or (None, None)
    assert held < 2.0 and step == 2 and torch.equal(got["w"].cpu(), want)
