"""The energy meter against the device's own counter, and what the meter costs.

    python benchmarks/energy.py --device cuda --seconds 60 --json /tmp/energy.json   # GPU
    .venv/bin/python benchmarks/energy.py                                           # CPU

GPU (`--device cuda`, the `energy` step of scripts/gpu_check.sh): a `--seconds` bf16 GEMM
load on GPU 0 while the meter integrates NVML's power samples every `--interval-s`
(`EnergyMeter(prefer="power")`), beside NVML's own energy counter read at the start and
the end of the load (`nvmlDeviceGetTotalEnergyConsumption`). Target (issue 36): the
integrated joules within 5% of the counter's difference. The counter-method meter (what
the launcher uses on such a GPU) is reported beside it.

CPU (`--device cpu`): what this host can read (RAPL: readable or why not), the same
comparison on fake NVML GPUs whose power steps every 0.2 s between 80 and 700 W (the
truth known exactly, so the trapezoid's error is the meter's alone) at several sampling
intervals, and the meter's cost per sample (median over `--repeats`, 8 fake GPUs and,
where readable, RAPL), so the launcher's 0.5-s sampling is shown to cost nothing.
Prints a table; `--json PATH` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.energy import (
    EnergyMeter,
    EnergyReader,
    EnergyUnavailableError,
    Reading,
    open_readers,
)
from argosy.hardware.fake_energy import FakeGpu, FakeNvml

TARGET_ERROR = 0.05


def compare(
    reader: EnergyReader, load: Callable[[], None], interval_s: float
) -> dict[str, dict[str, Any]]:
    """Run `load` while a power-integrating meter samples `reader`; per device, the meter's
    joules beside the counter's difference over the same span, and the relative error."""
    meter = EnergyMeter([reader], interval_s=interval_s, prefer="power")
    before = reader.read()
    meter.start()
    load()
    after = reader.read()
    meter.stop()  # one last sample, microseconds after `after`
    out = {}
    for device, got in meter.summary().items():
        counter = _difference(before.get(device), after.get(device))
        integrated = got["energy_j"]
        error = None
        if counter and integrated is not None:
            error = round(abs(integrated - counter) / counter, 5)
        out[device] = {
            "integrated_j": integrated,
            "counter_j": None if counter is None else round(counter, 3),
            "error": error,
            "within_target": None if error is None else error <= TARGET_ERROR,
            "avg_w": got["avg_w"],
            "peak_w": got["peak_w"],
            "samples": got["samples"],
        }
    return out


def _difference(first: Reading | None, last: Reading | None) -> float | None:
    if first is None or last is None or first.energy_j is None or last.energy_j is None:
        return None
    delta = last.energy_j - first.energy_j
    return delta + last.wrap_j if delta < 0 and last.wrap_j else delta


def bursty(nvml: FakeNvml, seconds: float, step_s: float = 0.2) -> Callable[[], None]:
    """A load on the fake GPUs whose power jumps every `step_s` (a deterministic pattern)."""
    levels = (700.0, 80.0, 450.0, 650.0, 120.0, 300.0, 700.0, 250.0)

    def run() -> None:
        end = time.monotonic() + seconds
        k = 0
        while time.monotonic() < end:
            for i in range(len(nvml.gpus)):
                nvml.set_power(i, levels[(k + i) % len(levels)])
            k += 1
            time.sleep(min(step_s, max(0.0, end - time.monotonic())))

    return run


def gemm(seconds: float, size: int = 8192) -> Callable[[], None]:
    """bf16 GEMMs on cuda:0 for `seconds` (each round ends on a host read: synchronized)."""
    import torch

    a = torch.randn(size, size, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda:0", dtype=torch.bfloat16)

    def run() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                c = a @ b
            float(c[0, 0].item())

    warm_until = time.monotonic() + 2.0  # clocks and power up before the measured span
    while time.monotonic() < warm_until:
        float((a @ b)[0, 0].item())
    return run


def sample_cost_us(readers: list[EnergyReader], repeats: int) -> float:
    """Median microseconds of one `EnergyMeter.sample()` over these readers."""
    meter = EnergyMeter(readers)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        meter.sample()
        times.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(times), 2)


def gpu_run(args: argparse.Namespace) -> dict[str, Any]:
    reader = NvmlEnergyReader(indices=[0])
    counter_meter = EnergyMeter([NvmlEnergyReader(indices=[0])], interval_s=args.interval_s)
    load = gemm(args.seconds)
    counter_meter.start()
    result = compare(reader, load, args.interval_s)
    counter_meter.stop()
    gpu = result["gpu0"]
    gpu["counter_meter_j"] = counter_meter.summary()["gpu0"]["energy_j"]
    return {"device": "cuda", "seconds": args.seconds, "interval_s": args.interval_s, **gpu}


def cpu_run(args: argparse.Namespace) -> dict[str, Any]:
    readers, why_not = open_readers(["rapl"])
    host = {"rapl": "readable" if readers else why_not.get("rapl")}
    intervals = {}
    for interval in args.intervals:
        nvml = FakeNvml([FakeGpu(300.0)])
        got = compare(NvmlEnergyReader(nvml), bursty(nvml, args.seconds), interval)["gpu0"]
        intervals[str(interval)] = got
    cost = {"fake_nvml_8_gpus": sample_cost_us([NvmlEnergyReader(_fake(8))], args.repeats)}
    if readers:
        cost["rapl"] = sample_cost_us(readers, args.repeats)
    return {
        "device": "cpu",
        "seconds": args.seconds,
        "host": host,
        "intervals": intervals,
        "sample_cost_us": cost,
    }


def _fake(count: int) -> FakeNvml:
    return FakeNvml([FakeGpu(100.0 + 10 * i) for i in range(count)])


def report(result: dict[str, Any]) -> None:
    if result["device"] == "cuda":
        r = result
        print(f"GEMM {r['seconds']} s on GPU 0, power sampled every {r['interval_s']} s")
        print(f"  integrated power  {r['integrated_j']:.1f} J")
        print(f"  NVML counter diff {r['counter_j']:.1f} J   error {r['error']:.2%}")
        print(f"  counter meter     {r['counter_meter_j']:.1f} J   avg {r['avg_w']} W")
        return
    print(f"RAPL on this host: {result['host']['rapl']}")
    print(f"fake GPU, power stepping every 0.2 s, {result['seconds']} s:")
    print(f"  {'interval s':>10} {'integrated J':>13} {'truth J':>9} {'error':>7}")
    for interval, r in result["intervals"].items():
        row = f"{r['integrated_j']:>13.1f} {r['counter_j']:>9.1f} {r['error']:>7.2%}"
        print(f"  {interval:>10} {row}")
    for what, us in result["sample_cost_us"].items():
        print(f"one sample ({what}): {us} us median")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=None, help="load length (cuda 60, cpu 3)")
    p.add_argument("--interval-s", type=float, default=0.1, help="GPU power sampling interval")
    p.add_argument("--intervals", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.5])
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args()
    if args.seconds is None:
        args.seconds = 60.0 if args.device == "cuda" else 3.0
    try:
        result = gpu_run(args) if args.device == "cuda" else cpu_run(args)
    except EnergyUnavailableError as err:
        raise SystemExit(f"energy: {err}") from err
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
