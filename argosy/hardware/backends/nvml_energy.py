"""NVIDIA GPU energy and power through NVML: the `EnergyReader` for `hardware.energy`.

Per GPU: `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded; Volta and
newer) and `nvmlDeviceGetPowerUsage` (mW). A figure the device does not support is None
(the meter then integrates power, or lists the device as not measured). The NVML module
is a seam: tests pass `argosy.hardware.fake_energy.FakeNvml`; by default `pynvml` is
imported when the reader opens. `indices` restricts the reader to some GPUs (NVML's
numbering), e.g. those a run was given.

    reader = NvmlEnergyReader()        # EnergyUnavailableError when NVML cannot start
    reader.read()["gpu0"]              # Reading(energy_j=..., power_w=...)
    reader.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from argosy.hardware.backends.nvml import load_nvml
from argosy.hardware.backends.signals import SignalsUnavailableError
from argosy.hardware.energy import EnergyUnavailableError, Reading


class NvmlEnergyReader:
    """Energy counter and power draw of every GPU NVML sees (or of `indices`)."""

    name = "nvml"

    def __init__(self, nvml: Any = None, indices: Sequence[int] | None = None) -> None:
        try:
            self._nvml = nvml or load_nvml()
        except SignalsUnavailableError as err:
            raise EnergyUnavailableError(str(err)) from err
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            raise EnergyUnavailableError(f"NVML cannot start: {err}") from err
        count = self._nvml.nvmlDeviceGetCount()
        wanted = range(count) if indices is None else indices
        unknown = [i for i in wanted if not 0 <= i < count]
        if unknown:
            self._nvml.nvmlShutdown()
            raise EnergyUnavailableError(f"NVML sees {count} GPU(s); no GPU {unknown}")
        self._handles = {f"gpu{i}": self._nvml.nvmlDeviceGetHandleByIndex(i) for i in wanted}
        self._open = True

    def devices(self) -> list[str]:
        return list(self._handles)

    def read(self) -> dict[str, Reading]:
        nvml = self._nvml
        out = {}
        for device, handle in self._handles.items():
            millijoules = _figure(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            milliwatts = _figure(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
            out[device] = Reading(
                energy_j=None if millijoules is None else millijoules / 1000.0,
                power_w=None if milliwatts is None else milliwatts / 1000.0,
            )
        return out

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()


def _figure(nvml: Any, call: Any, handle: Any) -> float | None:
    """`call(handle)`, or None when the device does not support it or the read failed
    (a GPU that fell off the bus mid-run leaves a gap, not a crash of the launcher)."""
    try:
        return float(call(handle))
    except nvml.NVMLError:
        return None
