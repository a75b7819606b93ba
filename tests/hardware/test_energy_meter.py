"""The energy meter: counters, integrated power, wrap-around, not measured, interpolation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.core.clock import FakeClock
from argosy.core.errors import UnknownNameError
from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.backends.rapl import RaplReader
from argosy.hardware.energy import (
    DeviceTrace,
    EnergyMeter,
    EnergyUnavailableError,
    Reading,
    open_readers,
    visible_gpu_options,
)
from argosy.hardware.fake_energy import FakeGpu, FakeNvml, FakePowercap


def _nvml_meter(gpus: list[FakeGpu], **kw: object) -> tuple[EnergyMeter, FakeNvml, FakeClock]:
    clock = FakeClock(10.0)
    nvml = FakeNvml(gpus, clock=clock)
    return EnergyMeter([NvmlEnergyReader(nvml)], clock=clock, **kw), nvml, clock


def test_counter_gives_the_true_energy_and_power_samples_the_peak() -> None:
    meter, nvml, clock = _nvml_meter([FakeGpu(100.0)])
    meter.sample()
    for watts in (100.0, 400.0, 250.0):
        nvml.set_power(0, watts)
        clock.advance(2.0)
        meter.sample()
    got = meter.summary()["gpu0"]
    assert got["method"] == "counter"
    assert got["energy_j"] == pytest.approx(nvml.true_energy_j(0), abs=0.01)
    assert got["energy_j"] == pytest.approx(1500.0, abs=0.01)
    assert got["avg_w"] == pytest.approx(250.0, abs=0.01)
    assert got["peak_w"] == 400.0  # the highest sampled draw


def test_power_only_device_is_integrated() -> None:
    meter, nvml, clock = _nvml_meter([FakeGpu(200.0, counter=False)])
    meter.sample()
    clock.advance(3.0)
    meter.sample()
    got = meter.summary()["gpu0"]
    assert got["method"] == "integrated"
    assert got["energy_j"] == pytest.approx(600.0)
    assert got["peak_w"] == 200.0


def test_prefer_power_integrates_even_with_a_counter() -> None:
    meter, _nvml, clock = _nvml_meter([FakeGpu(90.0)], prefer="power")
    meter.sample()
    clock.advance(1.0)
    meter.sample()
    assert meter.summary()["gpu0"]["method"] == "integrated"


def test_joules_between_sums_the_measured_devices_over_the_window() -> None:
    meter, nvml, clock = _nvml_meter(
        [FakeGpu(100.0), FakeGpu(300.0), FakeGpu(80.0, counter=False, power=False)]
    )
    meter.sample()
    t0 = clock.now_s()
    for _ in range(4):
        clock.advance(0.5)
        meter.sample()
    assert meter.joules_between(t0, clock.now_s()) == pytest.approx(400.0 * 2.0, abs=0.01)
    assert meter.joules_between(t0, t0 + 1.0) == pytest.approx(400.0, abs=0.01)
    alone, _nvml, clock = _nvml_meter([FakeGpu(80.0, counter=False, power=False)])
    alone.sample()
    clock.advance(1.0)
    alone.sample()
    assert alone.joules_between(10.0, 11.0) is None  # nothing measured: no number


def test_device_with_neither_figure_is_not_measured_never_a_constant() -> None:
    meter, _nvml, clock = _nvml_meter([FakeGpu(80.0, counter=False, power=False)])
    meter.sample()
    clock.advance(5.0)
    meter.sample()
    got = meter.summary()["gpu0"]
    assert got["method"] == "not measured"
    assert got["energy_j"] is None and got["avg_w"] is None and got["peak_w"] is None


def test_rapl_counter_wraps_around(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    cap = FakePowercap(tmp_path, [40.0], clock=clock, wrap_j=50.0)
    meter = EnergyMeter([RaplReader(cap.root)], clock=clock)
    meter.sample()
    for _ in range(10):  # 40 J per second, the counter wraps at 50 J
        clock.advance(1.0)
        cap.sync()
        meter.sample()
    got = meter.summary()["cpu-package-0"]
    assert got["method"] == "counter"
    assert got["energy_j"] == pytest.approx(400.0, abs=1e-3)
    assert got["peak_w"] == pytest.approx(40.0, abs=1e-3)  # counter-derived: RAPL has no power


def test_rapl_skips_sub_zones_and_psys(tmp_path: Path) -> None:
    cap = FakePowercap(tmp_path, [30.0, 30.0], psys=True)
    assert RaplReader(cap.root).devices() == ["cpu-package-0", "cpu-package-1"]


@pytest.mark.parametrize(
    ("make", "want_text"),
    [
        (lambda p: p / "absent", "does not exist"),
        (lambda p: FakePowercap(p, [10.0], readable=False).root, "not readable"),
        (lambda p: p, "no RAPL package zone"),
    ],
    ids=["no-powercap", "unreadable", "empty"],
)
def test_rapl_unavailable_says_why(tmp_path: Path, make, want_text: str) -> None:
    with pytest.raises(EnergyUnavailableError, match=want_text):
        RaplReader(make(tmp_path))


def test_counter_reset_without_range_counts_only_since_the_reset() -> None:
    trace = DeviceTrace("gpu0", "counter")
    for t, raw in ((0.0, 1000.0), (1.0, 1100.0), (2.0, 30.0), (3.0, 80.0)):
        trace.add(t, Reading(energy_j=raw))
    assert trace.total_j == pytest.approx(100.0 + 30.0 + 50.0)
    assert trace.summary()["counter_resets"] == 1


def test_open_readers_names_unknown_readers_and_why_others_are_out() -> None:
    with pytest.raises(UnknownNameError, match="known: .*nvml"):
        open_readers(["nvlm"])
    readers, why_not = open_readers()
    for reader in readers:
        reader.close()
    assert set(why_not) | {r.name for r in readers} == {"nvml", "rapl"}
    assert all(why for why in why_not.values())


def test_nvml_reader_refuses_a_gpu_it_does_not_see() -> None:
    with pytest.raises(EnergyUnavailableError, match="no GPU \\[3\\]"):
        NvmlEnergyReader(FakeNvml([FakeGpu()]), indices=[3])


def test_thread_samples_on_the_system_clock_and_stop_closes_the_readers() -> None:
    nvml = FakeNvml([FakeGpu(150.0)])
    seen: list[float] = []
    meter = EnergyMeter(
        [NvmlEnergyReader(nvml)], interval_s=0.01, on_sample=lambda t, _p: seen.append(t)
    )
    meter.start()
    time.sleep(0.15)
    meter.stop()
    got = meter.summary()["gpu0"]
    assert got["samples"] >= 5 and len(seen) == got["samples"]
    assert got["energy_j"] == pytest.approx(150.0 * got["seconds"], rel=0.05)
    assert nvml.opened == 0


POWER_STEPS = st.lists(
    st.tuples(st.floats(0.0, 700.0), st.floats(0.01, 5.0)), min_size=1, max_size=20
)


@settings(max_examples=60, deadline=None)
@given(steps=POWER_STEPS, data=st.data())
def test_counter_meter_matches_truth_and_intervals_add_up(steps, data) -> None:
    meter, nvml, clock = _nvml_meter([FakeGpu(0.0)])
    meter.sample()
    for watts, seconds in steps:
        nvml.set_power(0, watts)
        clock.advance(seconds)
        meter.sample()
    trace = meter.traces["gpu0"]
    assert trace.total_j == pytest.approx(nvml.true_energy_j(0), abs=0.001 * len(steps) + 1e-6)
    t0, t1 = trace.t_s[0], trace.t_s[-1]
    a, b = sorted(data.draw(st.floats(t0, t1)) for _ in range(2))
    assert trace.between(t0, a) + trace.between(a, b) + trace.between(b, t1) == pytest.approx(
        trace.total_j
    )
    assert trace.between(a, b) >= -1e-9


@settings(max_examples=60, deadline=None)
@given(steps=POWER_STEPS, per_step=st.integers(1, 4))
def test_integrated_power_is_exact_for_steady_draw_between_samples(steps, per_step) -> None:
    """With power constant between changes and a sample at each change (and after it),
    the trapezoid is the integral; more samples in between change nothing."""
    meter, nvml, clock = _nvml_meter([FakeGpu(steps[0][0], counter=False)])
    meter.sample()
    for i, (watts, seconds) in enumerate(steps):
        if i:
            nvml.set_power(0, watts)
            clock.advance(1e-6)  # the change, seen at once
            meter.sample()
        for _ in range(per_step):
            clock.advance(seconds / per_step)
            meter.sample()
    got = meter.traces["gpu0"].total_j
    assert got == pytest.approx(nvml.true_energy_j(0), rel=1e-3, abs=0.01)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, {}),
        ("0,2", {"nvml": {"indices": [0, 2]}}),
        ("GPU-1a2b", {}),
        ("", {"nvml": {"indices": []}}),
    ],
    ids=["unset", "indices", "uuids", "none-visible"],
)
def test_visible_devices_pick_the_gpus_metered(value: str | None, want: dict) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_gpu_options(env) == want
