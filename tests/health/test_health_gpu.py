"""The check on real GPUs: NCCL ranks, catalog expectations, host copy, NVML (skipped without)."""

from __future__ import annotations

import pytest

from argosy.health import HealthConfig, Verdict, run_check

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def test_every_probe_measures_on_gpus(_needs_cuda) -> None:
    torch = _needs_cuda
    report = run_check(HealthConfig())
    checks = {c.name: c for c in report.checks}
    assert report.node.device_type == "cuda" and report.node.dist_backend == "nccl"
    assert report.node.num_ranks == torch.cuda.device_count()
    for probe in ("gemm", "memory", "host_copy"):
        check = checks[f"{probe}.rank0"]
        assert check.value and check.value > 0, check
        if report.node.chip_id is not None:
            assert check.expected and check.verdict is not Verdict.NOT_APPLICABLE
    if report.node.num_ranks >= 2:
        assert checks["bus"].value and checks["bus"].value > 0
    assert any(name.startswith("xid_critical.dev") for name in checks) or (
        checks["vendor_signals"].verdict is Verdict.NOT_APPLICABLE
    )


def test_a_half_speed_gpu_is_found(_needs_cuda) -> None:
    if _needs_cuda.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to compare")
    report = run_check(HealthConfig(), slow={1: 0.5})
    slow = report.slow_devices()
    assert [d["rank"] for d in slow] == [1]
    assert 0.4 <= slow[0]["factor"] <= 0.6
