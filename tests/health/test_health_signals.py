"""Vendor signals: NVML read through a fake module, verdict rules, the backend capability."""
# ruff: noqa: N802, N815  (the fake mirrors pynvml names)

from __future__ import annotations

from types import SimpleNamespace

import pytest

from argosy.hardware.backends import backends
from argosy.hardware.backends.nvml import read_signals
from argosy.hardware.backends.signals import (
    SignalsUnavailableError,
    SupportsHealthSignals,
    VendorSignal,
)
from argosy.health.harness import read_vendor_signals
from argosy.health.signals import signal_checks, signal_verdict
from argosy.health.verdict import Verdict


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


class FakeNvml:
    """The part of pynvml the backend uses, with per-device counters and queued XIDs."""

    NVMLError = FakeNvmlError
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8
    nvmlClocksThrottleReasonHwSlowdown = 8
    nvmlClocksThrottleReasonHwThermalSlowdown = 64
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 128
    nvmlClocksThrottleReasonSwPowerCap = 4
    nvmlClocksThrottleReasonSwThermalSlowdown = 32
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[dict], xids: list[tuple[int, int]] = (), start_ok=True):
        self.devices, self.xids, self.start_ok = devices, list(xids), start_ok
        self.open = False

    def nvmlInit(self) -> None:
        if not self.start_ok:
            raise FakeNvmlError(12)
        self.open = True

    def nvmlShutdown(self) -> None:
        self.open = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def _dev(self, handle: str) -> dict:
        return self.devices[int(handle[1:])]

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, _counter: int) -> int:
        dev = self._dev(handle)
        if "ecc" not in dev:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return dev["ecc"][kind]

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        return self._dev(handle).get("remap", (0, 0, 0, 0))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:
        return self._dev(handle).get("reasons", 0)

    def nvmlDeviceGetTemperature(self, handle: str, _sensor: int) -> int:
        return self._supported_figure(handle, "temp")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        return self._supported_figure(handle, "limits")[0]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: str) -> int:
        return self._supported_figure(handle, "limits")[1]

    def _supported_figure(self, handle: str, key: str):  # noqa: ANN202
        dev = self._dev(handle)
        if key not in dev:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return dev[key]

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: str, kind: int, events: str) -> None:
        assert kind == self.nvmlEventTypeXidCriticalError and events == "events"

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> SimpleNamespace:
        if not self.xids:
            raise FakeNvmlError(self.NVML_ERROR_TIMEOUT)
        index, xid = self.xids.pop(0)
        return SimpleNamespace(device=f"h{index}", eventData=xid)

    def nvmlEventSetFree(self, events: str) -> None:
        assert events == "events"


def test_healthy_gpus_read_as_zero_counters() -> None:
    nvml = FakeNvml([{"ecc": (0, 0)}, {"ecc": (3, 0)}])
    signals = read_signals(nvml)
    assert not nvml.open  # NVML is shut down again
    names = {(s.device_index, s.name): s.value for s in signals}
    assert names[(1, "ecc_corrected")] == 3 and names[(0, "xid_critical")] == 0
    assert {signal_verdict(s) for s in signals} == {Verdict.HEALTHY}


def test_faulty_gpu_signals_fail_or_degrade_it() -> None:
    nvml = FakeNvml(
        [{"ecc": (0, 2), "remap": (0, 1, 1, 1)}, {"reasons": 64}, {}],
        xids=[(0, 79), (0, 48)],
    )
    checks = {c.name: c for c in signal_checks(read_signals(nvml))}
    assert checks["ecc_uncorrected.dev0"].verdict is Verdict.FAILED
    assert checks["remap_failed.dev0"].verdict is Verdict.FAILED
    assert checks["remap_pending.dev0"].verdict is Verdict.DEGRADED
    assert checks["xid_critical.dev0"].value == 2 and "79,48" in checks["xid_critical.dev0"].detail
    assert checks["hw_slowdown.dev1"].verdict is Verdict.DEGRADED
    assert "ecc_uncorrected.dev2" not in checks  # ECC not supported there: no signal
    assert checks["xid_critical.dev2"].verdict is Verdict.HEALTHY


def test_nvml_that_cannot_start_is_unavailable() -> None:
    with pytest.raises(SignalsUnavailableError, match="NVML cannot start"):
        read_signals(FakeNvml([], start_ok=False))


@pytest.mark.parametrize(
    ("name", "value", "want"),
    [
        ("ecc_corrected", 999, Verdict.HEALTHY),
        ("ecc_corrected", 1000, Verdict.DEGRADED),
        ("ecc_uncorrected", 1, Verdict.FAILED),
        ("hw_slowdown", 0, Verdict.HEALTHY),
    ],
    ids=["corrected-below", "corrected-storm", "uncorrected", "no-slowdown"],
)
def test_signal_rules(name: str, value: float, want: Verdict) -> None:
    assert signal_verdict(VendorSignal(0, name, value)) is want


def test_unknown_signal_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown vendor signal"):
        VendorSignal(0, "fan_speed", 1.0)


@pytest.mark.parametrize("name", list(backends))
def test_backends_offering_signals_keep_the_contract(name: str) -> None:
    """Contract: a backend that offers signals returns VendorSignals or says why it cannot."""
    backend = backends.get(name)()
    if not isinstance(backend, SupportsHealthSignals):
        assert name != "cuda", "the NVIDIA backend offers vendor signals"
        return
    try:
        signals = backend.health_signals(window_s=0.0)
    except SignalsUnavailableError as err:
        assert str(err)
        return
    assert all(isinstance(s, VendorSignal) for s in signals)


def test_a_node_without_signals_reports_not_applicable() -> None:
    checks = read_vendor_signals(0.0)
    if any(backends.get(n)().detect() for n in ("cuda",)):
        pytest.skip("an NVIDIA driver is present: covered by the GPU test")
    assert [c.verdict for c in checks] == [Verdict.NOT_APPLICABLE]


@pytest.mark.gpu
def test_real_nvml_signals_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    signals = backends.get("cuda")().health_signals(window_s=0.5)
    devices = {s.device_index for s in signals}
    assert devices == set(range(torch.cuda.device_count()))
    assert {"xid_critical", "hw_slowdown"} <= {s.name for s in signals}
