"""The GPU check's energy step on the CPU: benchmarks/energy.py's comparison of the meter's
integrated power with the device's own counter (on the fake NVML), and how
scripts/gpu_parts.py turns its JSON and the train step's summary into issue 36's targets."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.fake_energy import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _module(ROOT / "benchmarks" / "energy.py")
parts = _module(ROOT / "scripts" / "gpu_parts.py")


def test_integrated_power_meets_the_counter_on_a_bursty_load() -> None:
    nvml = FakeNvml([FakeGpu(300.0), FakeGpu(200.0, counter=False)])
    got = bench.compare(NvmlEnergyReader(nvml), bench.bursty(nvml, 0.8), interval_s=0.01)
    gpu = got["gpu0"]
    assert gpu["samples"] > 20
    assert gpu["error"] is not None and gpu["within_target"] is True, gpu
    assert gpu["counter_j"] == pytest.approx(gpu["integrated_j"], rel=0.05)
    assert got["gpu1"]["counter_j"] is None and got["gpu1"]["error"] is None  # no counter
    assert nvml.opened == 0  # the meter closed NVML


def test_too_slow_sampling_misses_the_target_and_says_so() -> None:
    nvml = FakeNvml([FakeGpu(300.0)])
    got = bench.compare(NvmlEnergyReader(nvml), bench.bursty(nvml, 1.0, step_s=0.2), 0.45)
    assert got["gpu0"]["within_target"] is False  # about 23% off: aliasing of 0.2-s steps


def _out(tmp: Path, energy: dict | None, run_summary: dict | None) -> Path:
    out = tmp / "out"
    out.mkdir()
    if energy is not None:
        (out / "energy.status").write_text('{"rc": 0, "seconds": 70}')
        (out / "energy.json").write_text(json.dumps(energy))
    run = tmp / "run"
    run.mkdir()
    if run_summary is not None:
        (run / "summary.json").write_text(json.dumps(run_summary))
    (out / "train.status").write_text('{"rc": 0, "seconds": 90}')
    (out / "train.json").write_text(json.dumps({"run_dirs": {"clean": str(run)}}))
    return out


@pytest.mark.parametrize(
    ("error", "energy_section", "want_meter", "want_train"),
    [
        (0.012, {"measured": True, "joules_per_step": 41.5}, True, True),
        (0.07, {"measured": False, "reason": "nvml: no GPU"}, False, False),
        (None, None, None, None),
    ],
    ids=["met", "missed-and-unmeasured", "step-not-run"],
)
def test_summary_sets_issue_36_targets(tmp_path, error, energy_section, want_meter, want_train):
    energy = None
    if error is not None:
        energy = {"integrated_j": 100.0 * (1 + error), "counter_j": 100.0, "error": error}
    summary = {"status": "completed", "energy": energy_section} if energy_section else None
    got = parts.summary(_out(tmp_path, energy, summary))["targets"]
    assert got["energy meter within 5% of NVML counter"]["met"] is want_meter
    assert got["training joules per step reported"]["met"] is want_train
    if want_train:
        assert got["training joules per step reported"]["figure"] == 41.5


@pytest.mark.parametrize(("median", "want"), [(0.021, True), (0.08, False), (None, None)])
def test_summary_sets_the_single_gpu_memory_target(tmp_path, median, want) -> None:
    """The `mem` step (benchmarks/planner_memory_single.py --device cuda --json) gives
    issue 33's single-GPU memory target: median error of the planner <= 5%."""
    out = tmp_path / "out"
    out.mkdir()
    if median is not None:
        (out / "mem.status").write_text('{"rc": 0, "seconds": 60}')
        doc = {"device": "H100", "peaks_gib": {"m1": 36.3}, "median_abs_error": median}
        (out / "mem.json").write_text(json.dumps(doc))
    got = parts.summary(out)["targets"]["single-GPU peak memory median <= 5% (issue 33)"]
    assert got["met"] is want
    if want is not None:
        assert got["figure"] == round(median, 3)
