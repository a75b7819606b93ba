"""Energy meter: joules per device from a vendor counter, integrated power, or nothing.

For each device the best source it offers wins:

1. an energy counter (NVML's total energy in mJ, RAPL's `energy_uj`): joules are the
   counter's differences, corrected for wrap-around when the counter has a known range
   (RAPL's `max_energy_range_uj`); a counter that goes back without a range is taken as
   reset and only the energy since the reset is added (a lower bound, flagged);
2. power samples (W): joules are the trapezoid over the samples the meter takes;
3. neither: the device is listed as "not measured" with energy None, never a constant.

A reader (one per vendor API, in `hardware/backends/`) only reads raw figures; this module
turns them into a trace per device (time, joules since the meter started, watts) and the
figures the reports use. Readers are registered by name in `energy_readers` (imported only
when used); `open_readers` opens those that can read on this machine and says why the
others cannot. The meter samples on a thread every `interval_s`, or when `sample()` is
called (tests drive it with a FakeClock).

    readers, why_not = open_readers()          # e.g. [nvml], {"rapl": "energy_uj not readable"}
    meter = EnergyMeter(readers, interval_s=0.5)
    meter.start(); ...; meter.stop()
    meter.summary()["gpu0"]                    # {"method": "counter", "energy_j": ..., ...}
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from argosy.core.clock import Clock, SystemClock
from argosy.plugins.registry import Registry

Method = Literal["counter", "integrated", "not measured"]
NOT_MEASURED: Method = "not measured"


class EnergyUnavailableError(RuntimeError):
    """A reader cannot read on this machine (no library, no driver, no permission); says why."""


@dataclass(frozen=True)
class Reading:
    """One device's raw figures at one instant; None where the device has no such figure.

    energy_j: the device's cumulative energy counter, in joules (may wrap or reset);
    power_w: its power draw now; wrap_j: the counter's range (it restarts at 0 past it).
    """

    energy_j: float | None = None
    power_w: float | None = None
    wrap_j: float | None = None


@runtime_checkable
class EnergyReader(Protocol):
    """One vendor API's energy and power figures for the devices it sees."""

    name: str

    def devices(self) -> list[str]:
        """Labels of the devices read, e.g. `gpu0`, `cpu-package-0`; fixed once opened."""
        ...

    def read(self) -> dict[str, Reading]:
        """Each device's figures now (a device that failed this read may be left out)."""
        ...

    def close(self) -> None:
        """Release the vendor library."""
        ...


energy_readers: Registry[Callable[..., EnergyReader]] = Registry("energy reader")
energy_readers.register("nvml", "argosy.hardware.backends.nvml_energy:NvmlEnergyReader")
energy_readers.register("rapl", "argosy.hardware.backends.rapl:RaplReader", aliases=("powercap",))


def open_readers(
    names: Iterable[str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> tuple[list[EnergyReader], dict[str, str]]:
    """The readers of `names` (default: every registered one) that can read here, and for
    the others the reason they cannot (an unknown name raises, listing the known ones).
    `options[name]` are that reader's keyword arguments (e.g. `{"nvml": {"indices": [0]}}`)."""
    chosen = [energy_readers.canonical(n) for n in (names or energy_readers.names())]
    readers: list[EnergyReader] = []
    why_not: dict[str, str] = {}
    for name in chosen:
        try:
            reader = energy_readers.get(name)(**(options or {}).get(name, {}))
        except EnergyUnavailableError as err:
            why_not[name] = str(err)
            continue
        if reader.devices():
            readers.append(reader)
        else:
            reader.close()
            why_not[name] = "no devices"
    return readers, why_not


def visible_gpu_options(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """`open_readers` options that meter only the GPUs in `CUDA_VISIBLE_DEVICES` when it
    lists indices (NVML numbers GPUs in PCI order: CUDA does too under
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and on nodes of one chip type by default); {} when it is
    unset or names GPUs by UUID (every GPU is metered then)."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return {}
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        return {}
    return {"nvml": {"indices": [int(e) for e in entries]}}


@dataclass
class DeviceTrace:
    """One device's samples: time (clock s), joules since the meter started, watts."""

    device: str
    method: Method
    t_s: list[float] = field(default_factory=list)
    energy_j: list[float] = field(default_factory=list)
    power_w: list[float | None] = field(default_factory=list)
    resets: int = 0
    """Times the counter went back with no known range (energy since each reset only)."""
    _last_raw: float | None = None

    def add(self, t_s: float, reading: Reading) -> None:
        """Fold one reading in (the first one sets the zero)."""
        if self.method == NOT_MEASURED:
            return
        if self.t_s and t_s <= self.t_s[-1]:
            return  # same instant: nothing to integrate
        energy = self._next_energy(t_s, reading)
        if energy is None:
            return
        self.t_s.append(t_s)
        self.energy_j.append(energy)
        self.power_w.append(reading.power_w)

    def _next_energy(self, t_s: float, reading: Reading) -> float | None:
        if self.method == "counter":
            if reading.energy_j is None:
                return None
            raw, last = reading.energy_j, self._last_raw
            self._last_raw = raw
            if last is None:
                return 0.0
            delta = raw - last
            if delta < 0:
                if reading.wrap_j:
                    delta += reading.wrap_j
                else:
                    self.resets += 1
                    delta = raw
            return self.energy_j[-1] + delta
        if reading.power_w is None:
            return None
        if not self.t_s:
            return 0.0
        last_w = self.power_w[-1]
        assert last_w is not None, "an integrated trace holds only power samples"
        return self.energy_j[-1] + (last_w + reading.power_w) / 2 * (t_s - self.t_s[-1])

    @property
    def total_j(self) -> float | None:
        """Joules from the first to the last sample; None when not measured."""
        if self.method == NOT_MEASURED or len(self.t_s) < 2:
            return None
        return self.energy_j[-1]

    def between(self, t0_s: float, t1_s: float) -> float | None:
        """Joules spent from t0 to t1 (clipped to the samples, linear between them)."""
        if self.total_j is None or t1_s <= t0_s:
            return None if self.total_j is None else 0.0
        return self.at(t1_s) - self.at(t0_s)

    def at(self, t_s: float) -> float:
        """Joules since the first sample at time t (linear interpolation, clipped)."""
        ts, es = self.t_s, self.energy_j
        if t_s <= ts[0]:
            return es[0]
        if t_s >= ts[-1]:
            return es[-1]
        lo, hi = 0, len(ts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ts[mid] <= t_s:
                lo = mid
            else:
                hi = mid
        share = (t_s - ts[lo]) / (ts[hi] - ts[lo])
        return es[lo] + share * (es[hi] - es[lo])

    def summary(self) -> dict[str, Any]:
        """Method, joules, seconds, average and peak watts (None where not measured)."""
        total = self.total_j
        if total is None:
            empty = dict.fromkeys(("energy_j", "seconds", "avg_w", "peak_w"))
            return {"method": NOT_MEASURED, **empty, "samples": len(self.t_s)}
        seconds = self.t_s[-1] - self.t_s[0]
        return {
            "method": self.method,
            "energy_j": round(total, 3),
            "seconds": round(seconds, 3),
            "avg_w": round(total / seconds, 2),
            "peak_w": round(self.peak_w(), 2),
            "samples": len(self.t_s),
            **({"counter_resets": self.resets} if self.resets else {}),
        }

    def peak_w(self) -> float:
        """Highest power seen: the largest sampled watts where the device reports power,
        else the largest average over one sampling interval of the counter."""
        sampled = [w for w in self.power_w if w is not None]
        if sampled:
            return max(sampled)
        pairs = zip(self.t_s, self.t_s[1:], self.energy_j, self.energy_j[1:], strict=False)
        return max((e1 - e0) / (t1 - t0) for t0, t1, e0, e1 in pairs)


def _method(reading: Reading | None, prefer: str) -> Method:
    if reading is None:
        return NOT_MEASURED
    if reading.energy_j is not None and (prefer == "counter" or reading.power_w is None):
        return "counter"
    return "integrated" if reading.power_w is not None else NOT_MEASURED


class EnergyMeter:
    """Samples every device of its readers into a `DeviceTrace` each.

    `prefer="power"` integrates power even where a counter exists (to check one against
    the other); `on_sample(t_s, {device: (joules, watts)})` sees each sample (the launcher
    appends it to the run's energy log).
    """

    def __init__(
        self,
        readers: list[EnergyReader],
        *,
        clock: Clock | None = None,
        interval_s: float = 0.5,
        prefer: Literal["counter", "power"] = "counter",
        on_sample: Callable[[float, dict[str, tuple[float, float | None]]], None] | None = None,
        unavailable: dict[str, str] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.readers = readers
        self.clock = clock or SystemClock()
        self.interval_s = interval_s
        self.prefer = prefer
        self.on_sample = on_sample
        self.unavailable = dict(unavailable or {})
        self.traces: dict[str, DeviceTrace] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Read every device once and fold the figures into its trace."""
        now = self.clock.now_s()
        readings: dict[str, Reading] = {}
        for reader in self.readers:
            readings.update(reader.read())
        with self._lock:
            for device, reading in readings.items():
                trace = self.traces.get(device)
                if trace is None:
                    trace = self.traces[device] = DeviceTrace(device, _method(reading, self.prefer))
                trace.add(now, reading)
            for reader in self.readers:  # a device that never read is listed, not measured
                for device in reader.devices():
                    self.traces.setdefault(device, DeviceTrace(device, NOT_MEASURED))
            point = {
                d: (t.energy_j[-1], t.power_w[-1])
                for d, t in self.traces.items()
                if t.t_s and t.t_s[-1] == now
            }
        if self.on_sample is not None and point:
            self.on_sample(now, point)

    def start(self) -> None:
        """Take the first sample now, then one every `interval_s` on a daemon thread."""
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="energy-meter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """Stop the thread, take a last sample, close the readers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()
        for reader in self.readers:
            reader.close()

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per device: method, joules, seconds, average and peak watts."""
        with self._lock:
            return {d: t.summary() for d, t in sorted(self.traces.items())}

    def joules_between(self, t0_s: float, t1_s: float) -> float | None:
        """Energy of every measured device between two instants of the meter's clock;
        None when no device is measured."""
        with self._lock:
            parts = [t.between(t0_s, t1_s) for t in self.traces.values()]
        measured = [p for p in parts if p is not None]
        return sum(measured) if measured else None
