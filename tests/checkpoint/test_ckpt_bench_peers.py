"""The DCP async_save peer of benchmarks/checkpoint.py runs on CPU and on device state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint.py"


def run_worker(peer: str, device: str) -> dict:
    cmd = [sys.executable, "-W", "ignore", str(BENCH), "--worker", peer, "--gb", "0.0625"]
    cmd += ["--repeats", "1", "--device", device]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])


def check(result: dict) -> None:
    assert 0 < result["stall_s"] <= result["durable_s"]
    assert result["disk_floor_s"] > 0 and result["disk_floor_writers"] in (1, 2, 4)


@pytest.mark.slow
def test_dcp_async_peer_on_cpu_state() -> None:
    check(run_worker("dcp_async", "cpu"))


@pytest.mark.gpu
def test_dcp_async_peer_on_device_state() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    check(run_worker("dcp_async", "cuda"))
