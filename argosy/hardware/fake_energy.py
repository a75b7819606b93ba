"""Fake energy sources that obey the real ones' contracts: an NVML module and a powercap tree.

The NVML fake also answers what the health signals read (limits, throttle reasons,
temperature; healthy ECC, no XID), so `nvml.read_signals(FakeNvml(...))` runs on it.

Both model devices whose power is piecewise constant in time (`set_power`), and whose
energy counter is that power's exact integral, so a meter reading them can be checked
against the truth. Time comes from a `Clock` (a FakeClock in unit tests; the system clock
when real processes and threads read them).

    nvml = FakeNvml([FakeGpu(300.0), FakeGpu(250.0, counter=False)], clock=clock)
    NvmlEnergyReader(nvml)                       # the real reader, on the fake module
    cap = FakePowercap(tmp_path, [100.0], clock=clock, wrap_j=50.0)
    RaplReader(cap.root)                         # the real reader, on the fake tree
    cap.set_power(0, 40.0); cap.sync()           # energy_uj follows the clock
"""

# ruff: noqa: N802, N815  (the fake mirrors pynvml's names)

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from argosy.core.clock import Clock, SystemClock


class FakeNvmlError(Exception):
    """pynvml.NVMLError: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class _Source:
    """Power (W, piecewise constant) and its integral (J) since creation."""

    watts: float
    joules: float = 0.0
    since_s: float = 0.0

    def advance(self, now_s: float) -> None:
        self.joules += self.watts * max(0.0, now_s - self.since_s)
        self.since_s = now_s


@dataclass
class FakeGpu:
    """One GPU: its power now, which figures it supports, its limits and throttle bits."""

    watts: float = 100.0
    counter: bool = True
    power: bool = True
    power_limit_w: float = 700.0
    default_limit_w: float = 700.0
    reasons: int = 0
    temperature_c: int = 60
    _source: _Source = field(init=False)

    def __post_init__(self) -> None:
        self._source = _Source(self.watts)


class FakeNvml:
    """The part of pynvml that the energy reader and the health signals use."""

    NVMLError = FakeNvmlError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_UNINITIALIZED = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_TIMEOUT = 10
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8
    nvmlClocksThrottleReasonSwPowerCap = 4
    nvmlClocksThrottleReasonHwSlowdown = 8
    nvmlClocksThrottleReasonSwThermalSlowdown = 32
    nvmlClocksThrottleReasonHwThermalSlowdown = 64
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 128

    def __init__(self, gpus: list[FakeGpu], clock: Clock | None = None) -> None:
        self.gpus = gpus
        self.clock = clock or SystemClock()
        self.opened = 0
        now = self.clock.now_s()
        for gpu in gpus:
            gpu._source.since_s = now

    def set_power(self, index: int, watts: float) -> None:
        """GPU `index` draws `watts` from now on."""
        gpu = self.gpus[index]
        gpu._source.advance(self.clock.now_s())
        gpu._source.watts = gpu.watts = watts

    def true_energy_j(self, index: int) -> float:
        """What the GPU has spent since the fake was made (the truth a meter is held to)."""
        source = self.gpus[index]._source
        source.advance(self.clock.now_s())
        return source.joules

    # -- pynvml ------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.opened += 1

    def nvmlShutdown(self) -> None:
        if self.opened == 0:
            raise FakeNvmlError(self.NVML_ERROR_UNINITIALIZED)
        self.opened -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def _gpu(self, handle: str) -> FakeGpu:
        if self.opened == 0:
            raise FakeNvmlError(self.NVML_ERROR_UNINITIALIZED)
        return self.gpus[int(handle[1:])]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        gpu = self._gpu(handle)
        if not gpu.counter:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return int(self.true_energy_j(int(handle[1:])) * 1000)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        gpu = self._gpu(handle)
        if not gpu.power:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        return int(self._gpu(handle).power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: str) -> int:
        return int(self._gpu(handle).default_limit_w * 1000)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:
        return self._gpu(handle).reasons

    def nvmlDeviceGetTemperature(self, handle: str, _sensor: int) -> int:
        return self._gpu(handle).temperature_c

    # healthy memory and no XID events: enough for `nvml.read_signals` to run on the fake
    def nvmlDeviceGetTotalEccErrors(self, handle: str, _kind: int, _counter: int) -> int:
        self._gpu(handle)
        return 0

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        self._gpu(handle)
        return (0, 0, 0, 0)

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: str, _kind: int, _events: str) -> None:
        self._gpu(handle)

    def nvmlEventSetWait_v2(self, _events: str, _timeout_ms: int) -> None:
        raise FakeNvmlError(self.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, _events: str) -> None:
        return None


class FakePowercap:
    """A `/sys/class/powercap` tree: one `intel-rapl:<k>` zone per package (with a core
    sub-zone and, when `psys`, a platform zone the reader must skip), whose `energy_uj`
    follows the packages' power and wraps at `wrap_j`. Call `sync()` before reading."""

    def __init__(
        self,
        root: Path,
        package_watts: list[float],
        clock: Clock | None = None,
        wrap_j: float = 262143.328850,
        psys: bool = True,
        readable: bool = True,
    ) -> None:
        self.root = root
        self.clock = clock or SystemClock()
        self.wrap_j = wrap_j
        now = self.clock.now_s()
        self._sources = [_Source(w, since_s=now) for w in package_watts]
        for k in range(len(package_watts)):
            self._zone(f"intel-rapl:{k}", f"package-{k}")
            self._zone(f"intel-rapl:{k}:0", "core")
        if psys:
            self._zone(f"intel-rapl:{len(package_watts)}", "psys")
        self.sync()
        if not readable:  # as the root-only file reads to a user (a chmod binds no root)
            for k in range(len(package_watts)):
                path = root / f"intel-rapl:{k}" / "energy_uj"
                path.unlink()
                path.symlink_to(root / "denied")

    def _zone(self, name: str, label: str) -> None:
        zone = self.root / name
        zone.mkdir(parents=True, exist_ok=True)
        (zone / "name").write_text(label + "\n")
        (zone / "max_energy_range_uj").write_text(f"{int(self.wrap_j * 1e6)}\n")
        (zone / "energy_uj").write_text("0\n")

    def set_power(self, package: int, watts: float) -> None:
        """Package `package` draws `watts` from now on."""
        self._sources[package].advance(self.clock.now_s())
        self._sources[package].watts = watts

    def true_energy_j(self, package: int) -> float:
        source = self._sources[package]
        source.advance(self.clock.now_s())
        return source.joules

    def sync(self) -> None:
        """Write each package's counter as of now (wrapped, in whole microjoules)."""
        wrap_uj = int(self.wrap_j * 1e6)
        for k in range(len(self._sources)):
            path = self.root / f"intel-rapl:{k}" / "energy_uj"
            if path.is_symlink():
                continue
            counter = int(self.true_energy_j(k) * 1e6) % wrap_uj
            (self.root / f"intel-rapl:{k}" / "energy_uj").write_text(f"{counter}\n")
