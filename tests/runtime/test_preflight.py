"""`argosy launch --preflight` end to end: a real node check (gloo ranks) with one device
throttled to half speed, then a launch that leaves it out or is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import argosy, summary

from argosy.runtime.events import read_events

SCRIPT = "import os\nprint('devices', os.environ.get('ARGOSY_DEVICES'))\n"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(SCRIPT)
    return path


def preflight(run: Path, script: Path, nproc: int, spares: int):  # noqa: ANN201
    return argosy(
        *("launch", "--quiet", "--tee", "--preflight", "--emulate-slow", "1:0.5"),
        *("--nproc-per-node", str(nproc), "--spares", str(spares), "--run-dir", str(run)),
        str(script),
        columns=400,
        timeout=240,
    )


@pytest.mark.slow
@pytest.mark.integration
def test_a_slow_device_is_left_out_when_a_spare_allows(tmp_path: Path, script: Path) -> None:
    run = tmp_path / "run"
    done = preflight(run, script, nproc=1, spares=1)
    assert done.returncode == 0, done.stderr
    assert "[rank0]: devices 0" in done.stdout
    assert "left out: device 1" in done.stderr
    checked = summary(run)["preflight"]
    assert checked["use"] == [0] and [e["device"] for e in checked["excluded"]] == [1]
    assert "gemm_peer.rank1 degraded" in checked["excluded"][0]["why"]
    (event,) = [e for e in read_events(run / "events.jsonl") if e["event"] == "preflight"]
    factors = {c["name"]: c["factor"] for c in event["checks"]}
    # Injected 0.5; the +/- 20% target is measured by benchmarks/preflight.py. Beside the
    # rest of the suite on two cores a CI run read 0.62: here it must read as half speed.
    assert 0.3 <= factors["gemm_peer.rank1"] <= 0.7


@pytest.mark.slow
@pytest.mark.integration
def test_without_a_spare_the_launch_is_refused_naming_the_device(
    tmp_path: Path, script: Path
) -> None:
    run = tmp_path / "run"
    done = preflight(run, script, nproc=2, spares=0)
    assert done.returncode == 1, done.stderr
    assert "device 1" in done.stderr and "gemm_peer.rank1" in done.stderr
    assert "Traceback" not in done.stderr
    s = summary(run)
    assert s["status"] == "refused" and s["preflight"]["refused"]
    assert not (run / "logs").exists()  # no rank was started


def test_emulate_slow_without_preflight_is_a_usage_error(tmp_path: Path, script: Path) -> None:
    done = argosy("launch", "--nproc-per-node", "1", "--emulate-slow", "1:0.5", str(script))
    assert done.returncode == 2 and "--preflight" in done.stderr
