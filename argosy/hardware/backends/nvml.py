"""NVIDIA health counters through NVML (the `nvidia-ml-py` package, module `pynvml`).

Reads, per GPU: volatile ECC counts, row-remapping state, active hardware slowdowns, the
enforced power limit against the default one, software thermal slowdown, and critical XID
events that arrive while it listens (`window_s`). XIDs logged before the
window are only in the kernel log and are not read here. The NVML module is passed in as a
seam so tests can hand in a fake; by default `pynvml` is imported when first used.

    signals = read_signals(window_s=2.0)
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from argosy.hardware.backends.signals import SignalsUnavailableError, VendorSignal

_SLOWDOWN_BITS = (
    "nvmlClocksThrottleReasonHwSlowdown",
    "nvmlClocksThrottleReasonHwThermalSlowdown",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
)


def load_nvml() -> ModuleType:
    """The pynvml module, or SignalsUnavailableError naming the missing package."""
    try:
        import pynvml
    except ImportError as err:
        raise SignalsUnavailableError("NVML bindings missing: pip install nvidia-ml-py") from err
    return pynvml


def read_signals(nvml: Any = None, window_s: float = 0.0) -> list[VendorSignal]:
    """Health counters of every GPU NVML sees; XIDs collected for `window_s` seconds."""
    nvml = nvml or load_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise SignalsUnavailableError(f"NVML cannot start: {err}") from err
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        signals = [s for i, h in enumerate(handles) for s in _device_signals(nvml, i, h)]
        return signals + _xid_signals(nvml, handles, window_s)
    finally:
        nvml.nvmlShutdown()


def _device_signals(nvml: Any, index: int, handle: Any) -> list[VendorSignal]:
    found: list[VendorSignal] = []
    for name, kind in (
        ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ):
        count = _supported(
            nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC
        )
        if count is not None:
            found.append(VendorSignal(index, name, float(count), "volatile count"))
    remap = _supported(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    if remap is not None:
        _corrected, _uncorrected, pending, failure = remap
        found.append(VendorSignal(index, "remap_pending", float(bool(pending))))
        found.append(VendorSignal(index, "remap_failed", float(bool(failure))))
    reasons = _supported(nvml, nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    if reasons is not None:
        active = [bit for bit in _SLOWDOWN_BITS if int(reasons) & getattr(nvml, bit)]
        found.append(VendorSignal(index, "hw_slowdown", float(bool(active)), ",".join(active)))
        found.append(_thermal(nvml, index, handle, int(reasons)))
    capped = _power_cap(nvml, index, handle, int(reasons or 0))
    return found + ([capped] if capped is not None else [])


def _thermal(nvml: Any, index: int, handle: Any, reasons: int) -> VendorSignal:
    """Software thermal slowdown now, with the GPU's temperature as the reason."""
    hot = bool(reasons & nvml.nvmlClocksThrottleReasonSwThermalSlowdown)
    celsius = _supported(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    at = f" at {celsius} C" if celsius is not None else ""
    detail = f"clocks held down for temperature{at}" if hot else f"no thermal slowdown{at}"
    return VendorSignal(index, "thermal_throttle", float(hot), detail)


def _power_cap(nvml: Any, index: int, handle: Any, reasons: int) -> VendorSignal | None:
    """How far the enforced power limit sits below the default one (None: not readable)."""
    enforced = _supported(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    default = _supported(nvml, nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
    if not enforced or not default:
        return None
    cut = max(0.0, 1.0 - enforced / default)
    at_cap = reasons & nvml.nvmlClocksThrottleReasonSwPowerCap
    detail = f"power limit {enforced / 1000:.0f} W of default {default / 1000:.0f} W" + (
        ", clocks held at the cap now" if at_cap else ""
    )
    return VendorSignal(index, "power_capped", round(cut, 4), detail)


def _xid_signals(nvml: Any, handles: list[Any], window_s: float) -> list[VendorSignal]:
    """Count critical XID events per device while listening for `window_s` seconds."""
    events = nvml.nvmlEventSetCreate()
    try:
        listening = [
            i
            for i, handle in enumerate(handles)
            if _supported(
                nvml,
                nvml.nvmlDeviceRegisterEvents,
                handle,
                nvml.nvmlEventTypeXidCriticalError,
                events,
            )
            is not False
        ]
        xids: dict[int, list[int]] = {i: [] for i in listening}
        deadline = time.monotonic() + window_s
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                data = nvml.nvmlEventSetWait_v2(events, wait_ms)
            except nvml.NVMLError as err:
                if err.value != nvml.NVML_ERROR_TIMEOUT:
                    raise SignalsUnavailableError(f"NVML event wait failed: {err}") from err
                break
            index = _index_of(handles, data.device)
            xids.setdefault(index, []).append(int(data.eventData))
        return [
            VendorSignal(i, "xid_critical", float(len(codes)), ",".join(map(str, codes)))
            for i, codes in sorted(xids.items())
        ]
    finally:
        nvml.nvmlEventSetFree(events)


def _index_of(handles: list[Any], handle: Any) -> int:
    for i, known in enumerate(handles):
        if known == handle:
            return i
    return -1


def _supported(nvml: Any, call: Any, *args: Any) -> Any:
    """`call(*args)`, or None (False for registration) when the device does not support it."""
    try:
        result = call(*args)
    except nvml.NVMLError as err:
        if err.value == nvml.NVML_ERROR_NOT_SUPPORTED:
            return False if call is nvml.nvmlDeviceRegisterEvents else None
        name = getattr(call, "__name__", str(call))
        raise SignalsUnavailableError(f"NVML call {name}: {err}") from err
    return True if result is None else result
