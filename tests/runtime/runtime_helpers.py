"""Helpers for runtime tests: run `argosy launch` as a real process, read what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import EXAMPLE, REPO, argosy

__all__ = ["EXAMPLE", "REPO", "argosy", "losses", "summary"]


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
