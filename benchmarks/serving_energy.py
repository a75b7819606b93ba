"""Joules of a benchmark's runs, from argosy's energy meter (`argosy.hardware.energy`).

    meter = RunMeter.open()           # the devices this machine can meter, or none
    t0 = meter.now(); ...; joules = meter.joules(t0, meter.now())   # None: not measured
    meter.close(); meter.why          # why nothing was measured, when nothing was

Each device's energy between two instants comes from its counter where it has one (NVML,
RAPL), else its integrated power; a machine with neither reports "not measured", never
a constant. The meter samples every 0.1 s on its own thread; a run shorter than a few
samples is measured coarsely, so the benchmark's tokens per joule are medians over runs.
"""

from __future__ import annotations

from argosy.hardware.energy import EnergyMeter, open_readers


class RunMeter:
    """An energy meter over every readable device, read between two of its own instants."""

    def __init__(self, meter: EnergyMeter | None, why: str) -> None:
        self.meter, self.why = meter, why

    @classmethod
    def open(cls) -> RunMeter:
        readers, why_not = open_readers()
        why = "; ".join(f"{name}: {reason}" for name, reason in sorted(why_not.items()))
        if not readers:
            return cls(None, why or "no energy reader")
        meter = EnergyMeter(readers, interval_s=0.1, unavailable=why_not)
        meter.start()
        return cls(meter, why)

    def now(self) -> float:
        return self.meter.clock.now_s() if self.meter is not None else 0.0

    def joules(self, t0_s: float, t1_s: float) -> float | None:
        """Energy of every metered device between the two instants; None if none is."""
        if self.meter is None:
            return None
        self.meter.sample()
        return self.meter.joules_between(t0_s, t1_s)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.stop()


def tokens_per_joule(rows: list[dict]) -> float | None:
    """Completion tokens over joules, summed over the runs that were measured."""
    measured = [r for r in rows if r.get("joules")]
    if not measured:
        return None
    return sum(len(r["tokens"]) for r in measured) / sum(r["joules"] for r in measured)
