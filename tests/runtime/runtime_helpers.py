"""Helpers for runtime tests: run `argosy launch` as a real process, read what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"


def argosy(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "argosy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step as the run finally kept it (a redone step's last value wins)."""
    out = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            out[event["step"]] = event["loss"]
    return out


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
