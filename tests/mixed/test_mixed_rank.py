"""The in-script side without processes: a restarted attempt keeps the launch's
calibrated emulation times (the kill-and-resume launch test runs on given times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from argosy.runtime.mixed.plan import (
    ENV_MIXED,
    GroupLayout,
    MixedLayout,
    assign_ranks,
    encode_assignments,
)
from argosy.runtime.mixed.rank import CALIBRATION_FILE, MixedRank


def test_a_restarted_attempt_reads_the_saved_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = (GroupLayout("h100-sxm", 1, 10, 2, 1, None, 1.0),)
    groups += (GroupLayout("a100-80g", 2, 8, 2, 1, None, 1.0),)
    layout = MixedLayout("batch", groups, 18, 1.0)
    emulation = {
        "chips": ["h100-sxm", "a100-80g", "a100-80g"],
        "relative_speed": [1.0, 0.3155, 0.3155],
        "headroom": 3.0,
        "sample_s": None,
    }
    path = tmp_path / "mixed" / "assignment.json"
    path.parent.mkdir()
    path.write_text(encode_assignments(layout, assign_ranks(layout), {"emulation": emulation}))
    saved = {"calibrated_s_per_sample": 0.01, "sample_s": {"h100-sxm": 0.03, "a100-80g": 0.095}}
    path.with_name(CALIBRATION_FILE).write_text(json.dumps(saved))
    monkeypatch.setenv(ENV_MIXED, str(path))
    mixed = MixedRank.from_env(2, 3, global_batch=18, micro_batch=2)

    def measure() -> None:
        raise AssertionError("a restarted attempt must not measure again")

    mixed.calibrate(measure)
    assert mixed.throttle.sample_s == 0.095
    assert mixed.doc["emulation"]["sample_s"] == saved["sample_s"]
