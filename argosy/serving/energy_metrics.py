"""A service's energy for `/metrics`: joules per generated token and average watts.

`ServingEnergy.open()` meters the GPUs this process may use (NVML, the indices in
`CUDA_VISIBLE_DEVICES` when it lists indices, else every GPU) and the host's CPU packages
(RAPL) on a thread (`hardware.energy`), from the moment the service starts. `metrics(
completion_tokens)` renders, in the Prometheus text format:

- argosy_serving_energy_measured: 1 when at least one device is metered, else 0 with the
  reason in a comment (the figures below are then absent: never a constant);
- argosy_serving_energy_joules_total{device}: joules since the service started;
- argosy_serving_power_avg_watts: those joules / the seconds metered (idle included);
- argosy_serving_energy_joules_per_token: those joules / completion tokens generated since
  the start (all-in: idle and prompt processing are charged to the generated tokens);
  rates over a window come from the counters (`rate(joules) / rate(tokens)`).

    energy = ServingEnergy.open()
    text = energy.metrics(stats.completion_tokens)
"""

from __future__ import annotations

from argosy.hardware.energy import EnergyMeter, EnergyReader, open_readers, visible_gpu_options


class ServingEnergy:
    """The meter of one serving process and its metrics."""

    def __init__(self, meter: EnergyMeter | None, why_not: str = "") -> None:
        self.meter = meter
        self.why_not = why_not

    @classmethod
    def open(cls, interval_s: float = 1.0) -> ServingEnergy:
        """Start metering this process's devices (a meter that reads nothing says why)."""
        readers, why_not = open_readers(options=visible_gpu_options())
        return cls.start(readers, why_not, interval_s)

    @classmethod
    def start(
        cls, readers: list[EnergyReader], why_not: dict[str, str], interval_s: float = 1.0
    ) -> ServingEnergy:
        why = "; ".join(f"{k}: {v}" for k, v in sorted(why_not.items()))
        if not readers:
            return cls(None, why or "no energy reader")
        meter = EnergyMeter(readers, interval_s=interval_s, unavailable=why_not)
        meter.start()
        return cls(meter, why)

    def metrics(self, completion_tokens: int) -> str:
        """The energy lines of `/metrics` (see the module docstring)."""
        devices = self.meter.summary() if self.meter is not None else {}
        measured = {d: s for d, s in devices.items() if s["energy_j"] is not None}
        lines = [_line("argosy_serving_energy_measured", "gauge", int(bool(measured)))]
        if not measured:
            return "\n".join([f"# energy not measured: {self.why_not or 'no device read'}", *lines])
        lines.append("# TYPE argosy_serving_energy_joules_total counter")
        for device, s in measured.items():
            lines.append(f'argosy_serving_energy_joules_total{{device="{device}"}} {s["energy_j"]}')
        joules = sum(s["energy_j"] for s in measured.values())
        watts = sum(s["avg_w"] for s in measured.values())  # each device's joules / its seconds
        lines.append(_line("argosy_serving_power_avg_watts", "gauge", round(watts, 3)))
        if completion_tokens:
            per_token = round(joules / completion_tokens, 6)
            lines.append(_line("argosy_serving_energy_joules_per_token", "gauge", per_token))
        return "\n".join(lines)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.stop()
            self.meter = None


def _line(name: str, kind: str, value: float) -> str:
    return f"# TYPE {name} {kind}\n{name} {value}"
