"""A real launch metered by the agent: fake NVML GPUs (the real reader, system clock), tiny
rank scripts without torch; summary.json's energy and `argosy runs show` print it."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from runtime_helpers import argosy

from argosy.hardware.backends.nvml_energy import NvmlEnergyReader
from argosy.hardware.fake_energy import FakeGpu, FakeNvml
from argosy.runtime.agent import Agent
from argosy.runtime.board import default_board_path
from argosy.runtime.config import RuntimeConfig
from argosy.runtime.group import GroupSpec
from argosy.runtime.inject import parse_injection

SCRIPT = """\
import sys, time
from argosy.runtime import hooks
rt = hooks.attach()
rt.work_per_step(tokens=1000, samples=4)
rt.restored(0, target_step=int(sys.argv[1]))
for step in range(1, int(sys.argv[1]) + 1):
    rt.step_begin(step)
    time.sleep(0.03)
    rt.step_end(step, 1.0 / step)
rt.finish()
"""


def _run(tmp_path: Path, watts: list[float], inject: list[str], steps: int = 20) -> tuple:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    run_id = uuid.uuid4().hex[:12]
    spec = GroupSpec(
        command=[sys.executable, str(script), str(steps)],
        nproc_per_node=1,
        run_dir=tmp_path / "run",
        board_path=default_board_path(run_id),
        t0=0.0,
        run_id=run_id,
    )
    nvml = FakeNvml([FakeGpu(w) for w in watts])
    config = RuntimeConfig(
        energy_interval_s=0.05, energy_log_interval_s=0.25, warm_standby=False, max_restarts=1
    )
    injections = [parse_injection(s, 1) for s in inject]
    agent = Agent(
        spec, injections, config, energy_readers=lambda: ([NvmlEnergyReader(nvml)], {"rapl": "x"})
    )
    return agent.run(), spec.run_dir, nvml


def test_a_metered_run_charges_a_crash_to_its_causes(tmp_path: Path) -> None:
    summary, run_dir, nvml = _run(tmp_path, [200.0, 50.0], ["kill:rank=0:step=10"])
    assert summary["status"] == "completed" and summary["restarts"] == 1
    energy = summary["energy"]
    assert energy["measured"] is True and energy["not_measured"] == {"rapl": "x"}
    assert set(energy["devices"]) == {"gpu0", "gpu1"}
    assert energy["devices"]["gpu0"]["avg_w"] == pytest.approx(200.0, rel=0.02)
    assert energy["devices"]["gpu1"]["peak_w"] == pytest.approx(50.0)
    assert energy["total_j"] <= nvml.true_energy_j(0) + nvml.true_energy_j(1)
    # steady draw: each bucket's joules are 250 W x its seconds
    assert energy["productive_j"] == pytest.approx(250.0 * summary["productive_s"], rel=0.05)
    for cause in ("startup", "detection", "restart", "redone"):
        want = 250.0 * summary["lost_s"][cause]
        assert energy["lost_j"][cause] == pytest.approx(want, rel=0.05, abs=1.0), cause
    assert energy["lost_j"]["redone"] > 0 and energy["steps"] == 20
    assert energy["tokens_per_joule"] == pytest.approx(1000 * 20 / energy["total_j"], rel=1e-3)
    assert json.loads((run_dir / "summary.json").read_text())["energy"] == energy
    lines = (run_dir / "energy.jsonl").read_text().splitlines()
    wall = summary["wall_s"]
    assert len(lines) <= wall / 0.25 + 4 < energy["devices"]["gpu0"]["seconds"] / 0.05  # thinned
    shown = argosy("runs", "show", str(run_dir), "--no-plot")
    assert shown.returncode == 0, shown.stderr
    for text in ("energy", "J per step", "tokens per joule", "gpu0", "lost: redone"):
        assert text in shown.stdout, text


def test_a_run_no_meter_reads_says_not_measured(tmp_path: Path) -> None:
    summary, run_dir, _ = _run(tmp_path, [], [], steps=3)
    energy = summary["energy"]
    assert energy["measured"] is False and "rapl: x" in energy["reason"]
    shown = argosy("runs", "show", str(run_dir), "--no-plot")
    assert "not measured" in shown.stdout and "rapl: x" in shown.stdout
