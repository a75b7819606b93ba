"""A service's energy in /metrics: joules per generated token and average watts from the
meter (fake NVML through the real reader), and "not measured" when nothing reads."""

from __future__ import annotations

import re

import pytest

from argosy.core.clock import FakeClock
from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.energy import EnergyMeter
from argosy.hardware.fake_energy import FakeGpu, FakeNvml
from argosy.serving.energy_metrics import ServingEnergy
from argosy.serving.metrics import render_metrics
from argosy.serving.types import EngineStats


def _value(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in\n{text}"
    return float(found.group(1))


def test_joules_per_token_and_average_watts() -> None:
    clock = FakeClock(0.0)
    nvml = FakeNvml([FakeGpu(250.0), FakeGpu(50.0)], clock=clock)
    meter = EnergyMeter([NvmlEnergyReader(nvml)], clock=clock)
    meter.sample()
    clock.advance(10.0)
    meter.sample()
    text = render_metrics(EngineStats(completion_tokens=1500), ServingEnergy(meter))
    assert _value(text, "argosy_serving_energy_measured") == 1
    assert _value(text, 'argosy_serving_energy_joules_total{device="gpu0"}') == 2500.0
    assert _value(text, "argosy_serving_power_avg_watts") == pytest.approx(300.0)
    assert _value(text, "argosy_serving_energy_joules_per_token") == pytest.approx(2.0)


def test_no_reader_says_not_measured_and_exports_no_figure() -> None:
    energy = ServingEnergy.start([], {"nvml": "NVML cannot start", "rapl": "no powercap"})
    text = render_metrics(EngineStats(completion_tokens=10), energy)
    assert _value(text, "argosy_serving_energy_measured") == 0
    assert "# energy not measured: nvml: NVML cannot start; rapl: no powercap" in text
    assert "joules" not in text.replace("# energy not measured", "")


def test_no_tokens_yet_gives_watts_but_no_joules_per_token() -> None:
    energy = ServingEnergy.start([NvmlEnergyReader(FakeNvml([FakeGpu(100.0)]))], {}, 0.01)
    energy.meter.sample()  # a second sample: the thread's first may not have come yet
    text = energy.metrics(completion_tokens=0)
    energy.close()
    assert "argosy_serving_power_avg_watts" in text
    assert "argosy_serving_energy_joules_per_token" not in text
