"""A CI-sized fault soak: every fault kind, every restore checked byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from argosy.checkpoint import soak

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


@pytest.mark.integration
@pytest.mark.parametrize("tmpfs", [True, False], ids=["tmpfs", "on-disk"])
def test_a_small_soak_finds_no_torn_lost_or_wrong_restore(tmp_path: Path, tmpfs: bool) -> None:
    # on disk, the shards' 1 MiB tensors go with direct I/O where the file system allows it
    report = soak.run_soak(tmp_path / "soak", faults=20, seed=4, tmpfs=tmpfs)
    if not tmpfs:
        assert report.disk_full_by == "injected ENOSPC"
    assert report.faults >= 20 and report.restores >= report.faults
    assert (report.torn, report.lost, report.wrong_restores) == (0, 0, 0), report.problems


def test_the_fault_kinds_cover_the_issue_list() -> None:
    assert set(soak.KINDS) == {
        "persister_kill",
        "persister_hang",
        "trainer_lost",
        "disk_full",
        "torn_file",
        "corrupt_shard",
        "torn_manifest",
    }
    assert abs(sum(soak.KINDS.values()) - 1.0) < 1e-9


def test_soak_cli_rejects_bad_counts_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--faults", "0", "--json"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--faults" in done.stderr and "Traceback" not in done.stderr


def test_report_json_has_the_contract_keys() -> None:
    report = soak.SoakReport(faults=3, restores=4, steps_lost=[0, 2, 1])
    got = json.loads(json.dumps(report.as_dict()))
    for key in ("faults", "restores", "torn", "lost", "wrong_restores", "steps_lost_per_fault"):
        assert key in got
    assert got["steps_lost_per_fault"] == 1.0
