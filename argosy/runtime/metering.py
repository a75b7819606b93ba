"""The launcher's energy meter: sample the node's devices while the run lasts, log them.

Effects only: opens the energy readers that can read on this node (NVML on the GPUs of
`CUDA_VISIBLE_DEVICES` when it lists indices, else every GPU; RAPL; see
`hardware.energy`), samples them every `RuntimeConfig.energy_interval_s` on a thread, and
appends a line to `<run dir>/energy.jsonl` every `energy_log_interval_s` (format in
`runtime.energy`: the joules then and the highest draw since the previous line, so the log
stays small, about 30 bytes per device per line, while the peak is that of every sample),
flushed line by line so a launcher killed hard still leaves what it had written. The readers are a
seam: tests hand in `open_readers` that return readers on the fakes.

    meter = RunMeter(run_dir, t0=spec.t0, clock=clock, interval_s=0.5)
    meter.start()
    ...
    meter.stop()
    summary["energy"] = meter.summary(events)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.core.clock import Clock
from argosy.hardware.energy import EnergyMeter, EnergyReader, visible_gpu_options
from argosy.hardware.energy import open_readers as open_energy_readers
from argosy.runtime.energy import ENERGY_FILE, WORK_FILE, energy_summary, read_trace, read_work

Opener = Callable[[], tuple[list[EnergyReader], dict[str, str]]]


def _node_readers() -> tuple[list[EnergyReader], dict[str, str]]:
    """Every reader that reads here; NVML only on the GPUs the launcher's environment
    makes visible to the ranks (all of them when it does not say)."""
    return open_energy_readers(options=visible_gpu_options())


def _round(watts: float | None) -> float | None:
    return None if watts is None else round(watts, 3)


class RunMeter:
    """One run's energy log; `disabled` (energy_interval_s = 0) meters nothing and says so."""

    def __init__(
        self,
        run_dir: Path,
        *,
        t0: float,
        clock: Clock,
        interval_s: float,
        log_interval_s: float = 5.0,
        open_readers: Opener | None = None,
    ) -> None:
        self.path = run_dir / ENERGY_FILE
        self.run_dir = run_dir
        self.t0 = t0
        self.clock = clock
        self.interval_s = interval_s
        self.log_interval_s = log_interval_s
        self.open_readers = open_readers or _node_readers
        self._meter: EnergyMeter | None = None
        self._file: Any = None
        self._lock = threading.Lock()
        self._written_s: float | None = None
        self._last: dict[str, tuple[float, float]] = {}  # device -> (time, joules) sampled
        self._peak: dict[str, float] = {}  # device -> highest watts since the last line
        self._closing = False

    def start(self) -> None:
        """Open the readers, write the header, take the first sample, start the thread."""
        self.path.unlink(missing_ok=True)
        if self.interval_s <= 0:
            self._write({"devices": {}, "unavailable": {"meter": "off (energy_interval_s=0)"}})
            return
        readers, unavailable = self.open_readers()
        self._file = self.path.open("a", encoding="utf-8")
        meter = EnergyMeter(
            readers, clock=self.clock, interval_s=self.interval_s, unavailable=unavailable
        )
        meter.sample()  # the first reading sets each device's method and its zero
        traces = sorted(meter.traces.items())
        methods = {d: t.method for d, t in traces}
        self._write({"devices": methods, "unavailable": unavailable, "interval_s": self.interval_s})
        first = {d: (t.energy_j[-1], t.power_w[-1]) for d, t in traces if t.t_s}
        if first:
            self._on_sample(next(t.t_s[-1] for _, t in traces if t.t_s), first)
        if readers:
            meter.on_sample = self._on_sample
            meter.start()
            self._meter = meter

    def _on_sample(self, now_s: float, point: dict[str, tuple[float, float | None]]) -> None:
        """Track each device's peak draw; write a line every `log_interval_s` (and the
        first and last sample), with the joules now and the peak since the last line."""
        if not point or self._file is None:
            return
        for device, (joules, watts) in point.items():
            last = self._last.get(device)
            if watts is None and last is not None and now_s > last[0]:
                watts = (joules - last[1]) / (now_s - last[0])  # counter only: its average
            self._last[device] = (now_s, joules)
            if watts is not None:
                self._peak[device] = max(self._peak.get(device, watts), watts)
        due = self._written_s is None or now_s - self._written_s >= self.log_interval_s
        if not (due or self._closing):
            return
        line = {d: [round(j, 4), _round(self._peak.get(d))] for d, (j, _w) in point.items()}
        self._write({"t": round(now_s - self.t0, 4), "d": line})
        self._written_s = now_s
        self._peak.clear()

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._file is None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                return
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def stop(self) -> None:
        """Last sample, thread stopped, readers closed, log closed."""
        self._closing = True  # the meter's last sample is written
        if self._meter is not None:
            self._meter.stop()
            self._meter = None
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def summary(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """summary.json's `energy` section, from the log this meter wrote."""
        traces, unavailable = read_trace(self.path)
        work = read_work(self.run_dir / WORK_FILE)
        return energy_summary(events, traces, work, unavailable)
