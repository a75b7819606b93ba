"""`argosy health check` end to end: real gloo ranks, JSON contract, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import argosy


@pytest.mark.slow
@pytest.mark.integration
def test_half_speed_rank_is_flagged_degraded_with_its_factor() -> None:
    done = argosy("health", "check", "--json", "--emulate-slow", "1:0.5")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] in {"degraded", "failed"}
    checks = {c["name"]: c for c in report["checks"]}
    for check in checks.values():
        assert {"name", "value", "unit", "expected", "verdict"} <= set(check)
    peer = checks["gemm_peer.rank1"]
    assert peer["verdict"] == "degraded"
    # Injected 0.5. The +/- 20% target is measured by benchmarks/health.py (RESULTS.md);
    # here, beside the rest of the suite on two cores, it must only read as half speed:
    # well below healthy and well above a quarter.
    assert 0.3 <= peer["factor"] <= 0.7, peer
    assert checks["gemm_peer.rank0"]["verdict"] == "healthy"
    assert checks["host_copy"]["verdict"] == "not_applicable"  # no accelerator here
    assert checks["bus"]["value"] > 0 and report["node"]["dist_backend"] == "gloo"
    assert [d["rank"] for d in report["slow_devices"]] == [1]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--emulate-slow", "1"], "RANK:FACTOR"),
        (["--emulate-slow", "1:1.5"], "factor must be in"),
        (["--emulate-slow", "7:0.5"], "beyond the node"),
        (["--ranks", "0"], "ranks must be at least 1"),
    ],
    ids=["no-factor", "factor-above-one", "rank-beyond", "zero-ranks"],
)
def test_usage_errors_exit_2_without_a_traceback(args: list[str], want: str) -> None:
    done = argosy("health", "check", *args, timeout=60)
    assert done.returncode == 2
    assert want in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1


def test_the_health_command_loads_no_torch_until_it_runs() -> None:
    code = (
        "import sys\n"
        "from argosy.cli.app import app\n"
        "import argosy.health, argosy.cli.health\n"
        "try:\n    app(['health', 'check', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH=' + str('torch' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "TORCH=False" in out.stdout, out.stdout + out.stderr
