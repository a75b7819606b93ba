"""The EnergyReader contract, run over the real readers on fakes and on this machine's own
sources where they can read (NVML on a GPU host, RAPL where energy_uj is readable)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from argosy.core.clock import FakeClock
from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.backends.rapl import RaplReader
from argosy.hardware.energy import EnergyReader, EnergyUnavailableError, Reading
from argosy.hardware.fake_energy import FakeGpu, FakeNvml, FakePowercap

Advance = Callable[[float], None]


def _fake_nvml(_tmp: Path) -> tuple[EnergyReader, Advance]:
    clock = FakeClock(100.0)
    gpus = [FakeGpu(300.0), FakeGpu(120.0, counter=False), FakeGpu(50.0, power=False)]
    return NvmlEnergyReader(FakeNvml(gpus, clock=clock)), clock.advance


def _fake_powercap(tmp: Path) -> tuple[EnergyReader, Advance]:
    clock = FakeClock(0.0)
    cap = FakePowercap(tmp, [65.0, 80.0], clock=clock, wrap_j=100.0)

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        cap.sync()

    return RaplReader(cap.root), advance


def _real(opener: Callable[[], EnergyReader], mark: str) -> Callable[[Path], tuple]:
    def make(_tmp: Path) -> tuple[EnergyReader, Advance]:
        try:
            reader = opener()
        except EnergyUnavailableError as err:
            pytest.skip(f"{mark}: {err}")
        return reader, time.sleep

    return make


SOURCES = {
    "fake-nvml": _fake_nvml,
    "fake-powercap": _fake_powercap,
    "nvml": pytest.param(_real(NvmlEnergyReader, "no NVML"), marks=pytest.mark.gpu),
    "rapl": _real(RaplReader, "RAPL not readable here"),
}


@pytest.fixture(params=list(SOURCES.values()), ids=list(SOURCES))
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple]:
    reader, advance = request.param(tmp_path)
    yield reader, advance
    reader.close()


def test_reader_is_an_energy_reader(source: tuple) -> None:
    reader, _ = source
    assert isinstance(reader, EnergyReader)
    assert reader.name in ("nvml", "rapl")


def test_devices_are_named_once_and_stable(source: tuple) -> None:
    reader, _ = source
    devices = reader.devices()
    assert devices, "an open reader sees at least one device"
    assert len(set(devices)) == len(devices)
    assert reader.devices() == devices


def test_readings_are_physical(source: tuple) -> None:
    reader, _ = source
    readings = reader.read()
    assert set(readings) <= set(reader.devices())
    for reading in readings.values():
        assert isinstance(reading, Reading)
        assert reading.energy_j is None or reading.energy_j >= 0
        assert reading.power_w is None or reading.power_w >= 0
        assert reading.wrap_j is None or reading.wrap_j > 0
        if reading.wrap_j is not None:
            assert reading.energy_j is not None and reading.energy_j < reading.wrap_j


def test_counters_move_forward_modulo_wrap(source: tuple) -> None:
    reader, advance = source
    first = reader.read()
    advance(0.2)
    second = reader.read()
    for device, now in second.items():
        before = first.get(device)
        if before is None or before.energy_j is None or now.energy_j is None:
            continue
        delta = now.energy_j - before.energy_j
        if delta < 0:
            assert now.wrap_j is not None, f"{device}: counter went back with no range"
            delta += now.wrap_j
        assert delta >= 0


def test_close_twice_is_harmless(source: tuple) -> None:
    reader, _ = source
    reader.close()
    reader.close()
