"""The pytorch profile's single-device memory against peaks tracked at the dispatcher
(benchmarks/planner_memory_single.py holds the tracker, the program and the matrix), and
the tracker itself against known allocations and torch's own MemTracker."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "planner_memory_single.py"
_SPEC = importlib.util.spec_from_file_location("planner_memory_single", _PATH)
pms = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = pms  # dataclasses resolve their module by name
_SPEC.loader.exec_module(pms)

TINY = {"layers": 2, "hidden": 1024, "heads": 16, "kv_heads": 8, "ffn": 4096, "vocab": 32000,
        "seq": 1024, "mbs": 2, "ga": 2}  # fmt: skip


def test_tracker_counts_a_known_allocation_pattern_exactly() -> None:
    with pms.LiveBytes(block=512) as live:
        a = torch.empty(1000)  # 4,000 bytes: one 4,096-byte block
        b = torch.empty(10)  # 40 bytes: the 512-byte minimum
        a.view(10, 100).add_(1.0)  # a view and an in-place op allocate nothing
        c = a + 1.0  # 4,096
        assert live.current == 4096 + 512 + 4096
        del c, b
        assert live.current == 4096
        d = torch.empty(0)  # no storage bytes
        assert live.current == 4096
    assert live.peak == 4096 + 512 + 4096 and live.peak_op == "add"
    del a, d


def test_tracker_without_rounding_matches_torch_memtracker() -> None:
    """Two steps of a tiny Hugging Face Llama under fake tensors: the same peak as
    torch.distributed._tools.mem_tracker.MemTracker, which does not round CPU storages."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    point = pms.Point("tiny", **{**TINY, "hidden": 256, "heads": 4, "kv_heads": 2,
                                 "ffn": 512, "vocab": 4096, "seq": 256})  # fmt: skip
    with FakeTensorMode():
        model, opt = pms.build(point, "cpu")
        ids = torch.randint(0, point.vocab, (point.mbs, point.seq))
        tracker = MemTracker()
        tracker.track_external(model, opt, ids)
        with tracker, pms.LiveBytes(block=1) as live:
            live.track(model, opt, ids)
            for _ in range(2):
                for _ in range(point.ga):
                    tracker.reset_mod_stats()  # MemTracker allows one call per module
                    (model(input_ids=ids, labels=ids).loss / point.ga).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    (peak,) = (snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    assert live.peak == peak


@pytest.mark.parametrize("ckpt", [False, True], ids=["no-ac", "full-ac"])
def test_fake_step_tracks_the_same_peak_as_the_real_step(ckpt: bool) -> None:
    """The same tiny step with real CPU tensors (transformers reads the real position ids
    and decides on the mask itself) peaks at exactly the fake step's bytes."""
    point = pms.Point("tiny", 2, 256, 4, 2, 512, 1000, 128, 2, 2, ckpt)
    model, opt = pms.build(point, "cpu")
    ids = torch.randint(0, point.vocab, (point.mbs, point.seq))
    with pms.LiveBytes() as live:
        live.track(model, opt, ids)
        pms.train(model, opt, ids, point.ga, steps=2)
    assert live.peak == pms.tracked_peak(point).peak


CASES = {
    "no-ac": ({}, "_log_softmax_backward_data"),  # the loss's backward
    "full-ac": ({"ckpt": True}, "_log_softmax_backward_data"),
    "one-microbatch": ({"ga": 1}, "_log_softmax_backward_data"),  # before any gradient
    "one-short-microbatch": ({"ga": 1, "seq": 128, "mbs": 1}, "embedding_dense_backward"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_within_one_percent_of_the_tracked_peak(case: str) -> None:
    """The `hf` accounting counts what the tracked step keeps, wherever its peak falls: at
    the loss, or at the end of the backward when one short micro-batch leaves the
    gradients as the larger term."""
    update, peak_op = CASES[case]
    point = pms.Point("tiny", **{**TINY, **update})
    live = pms.tracked_peak(point)
    assert live.peak_op == peak_op
    allocated, total = pms.estimate(point)
    tracked = live.peak / pms.GIB
    assert abs(allocated / tracked - 1) <= 0.01
    assert total > allocated  # the reserve comes on top


def test_sdpa_runs_the_flash_kernel_causal_with_gqa_and_no_mask() -> None:
    """Under fake tensors on the CPU, HF's sdpa attention hits the flash-style kernel as
    the real step does: `is_causal=True`, no mask, K and V on their own (kv) heads."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    point = pms.Point("tiny", **{**TINY, "layers": 1})
    seen: dict[str, tuple] = {}

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            seen[func.overloadpacket.__name__] = (args, kwargs or {})
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), pms.real_mask_decision():
        model, opt = pms.build(point, "cpu")
        ids = torch.randint(0, point.vocab, (1, point.seq))
        with Ops():
            model(input_ids=ids, labels=ids).loss.backward()
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in seen
    args, kwargs = seen["_scaled_dot_product_flash_attention_for_cpu"]
    query, key = args[0], args[1]
    assert query.shape[1] == point.heads and key.shape[1] == point.kv_heads
    assert args[4] is True and kwargs.get("attn_mask") is None  # is_causal, no mask
    assert not seen.keys() & {"_softmax", "bmm", "baddbmm", "where"}  # no seq x seq tensor


@pytest.mark.skipif(torch.cuda.is_available(), reason="would run the real matrix")
def test_cuda_mode_skips_cleanly_without_a_gpu(monkeypatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.setattr(sys, "argv", ["planner_memory_single.py", "--device", "cuda"])
    pms.main()
    assert "skipped" in capsys.readouterr().out
