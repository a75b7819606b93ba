"""Power-limit and thermal-throttle signals: read through the fake NVML, judged, and a device
that shows them is left out of a launch with the vendor's reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from argosy.hardware.backends.nvml import read_signals
from argosy.hardware.fake_energy import FakeGpu, FakeNvml
from argosy.health.preflight import choose_devices
from argosy.health.report import HealthReport, NodeInfo
from argosy.health.signals import signal_checks
from argosy.health.verdict import CheckResult, Verdict

H, D, F = Verdict.HEALTHY, Verdict.DEGRADED, Verdict.FAILED
SW_THERMAL = FakeNvml.nvmlClocksThrottleReasonSwThermalSlowdown
SW_POWER_CAP = FakeNvml.nvmlClocksThrottleReasonSwPowerCap


def _checks(gpus: list[FakeGpu]) -> dict[str, CheckResult]:
    return {c.name: c for c in signal_checks(read_signals(FakeNvml(gpus)))}


@pytest.mark.parametrize(
    ("gpu", "name", "want", "want_detail"),
    [
        (FakeGpu(power_limit_w=700.0), "power_capped.dev0", H, "700 W of default 700 W"),
        (FakeGpu(power_limit_w=650.0), "power_capped.dev0", H, "650 W of default 700 W"),
        (FakeGpu(power_limit_w=400.0), "power_capped.dev0", D, "400 W of default 700 W"),
        (FakeGpu(reasons=SW_POWER_CAP), "power_capped.dev0", H, "clocks held at the cap"),
        (FakeGpu(reasons=SW_THERMAL, temperature_c=91), "thermal_throttle.dev0", D, "at 91 C"),
        (FakeGpu(temperature_c=55), "thermal_throttle.dev0", H, "no thermal slowdown at 55 C"),
    ],
    ids=["at-default", "cut-7pct", "cut-43pct", "at-cap-under-load", "hot", "cool"],
)
def test_power_and_thermal_signals(gpu: FakeGpu, name: str, want: Verdict, want_detail: str):
    check = _checks([gpu])[name]
    assert check.verdict is want
    assert want_detail in check.detail


def test_power_cap_value_is_the_share_cut() -> None:
    check = _checks([FakeGpu(power_limit_w=350.0, default_limit_w=700.0)])["power_capped.dev0"]
    assert check.value == pytest.approx(0.5) and check.unit == "share"


def _report(per_device: list[list[CheckResult]]) -> HealthReport:
    checks = [c for device in per_device for c in device]
    info = NodeInfo("cuda", "h100", len(per_device), "nccl", "test")
    return HealthReport(tuple(checks), info, 1.0)


def _device(k: int, throttled: bool = False, capped: bool = False) -> list[CheckResult]:
    gpu = FakeGpu(reasons=SW_THERMAL if throttled else 0, power_limit_w=300.0 if capped else 700)
    gemm = CheckResult(f"gemm.rank{k}", 1.0, "TFLOP/s", 1.0, H, 1.0)
    signals = signal_checks(read_signals(FakeNvml([gpu])))
    renamed = [replace(c, name=c.name.replace(".dev0", f".dev{k}")) for c in signals]
    return [gemm, *renamed]


def test_a_throttled_device_is_left_out_with_its_reason() -> None:
    decision = choose_devices(_report([_device(0), _device(1, throttled=True), _device(2)]), 2)
    assert decision.use == (0, 2) and decision.refused is None
    (excluded,) = decision.excluded
    assert excluded["device"] == 1
    assert "thermal_throttle.dev1 degraded" in excluded["why"]
    assert "clocks held down for temperature" in excluded["why"]


def test_a_capped_device_without_a_spare_refuses_the_launch_naming_the_cap() -> None:
    decision = choose_devices(_report([_device(0, capped=True), _device(1)]), 2)
    assert decision.use == ()
    assert "power_capped.dev0" in decision.refused and "300 W of default 700 W" in decision.refused


def test_every_device_capped_alike_is_the_nodes_and_only_warns() -> None:
    decision = choose_devices(_report([_device(0, capped=True), _device(1, capped=True)]), 2)
    assert decision.use == (0, 1)
    assert any("power_capped" in w and "the node's" in w for w in decision.node_warnings)


def test_a_failed_device_signal_still_refuses_the_node() -> None:
    bad = CheckResult("ecc_uncorrected.dev1", 1.0, "count", 0.0, F, None, "volatile count")
    decision = choose_devices(_report([_device(0), [*_device(1), bad], _device(2)]), 1)
    assert decision.refused is not None and "ecc_uncorrected.dev1 failed" in decision.refused
