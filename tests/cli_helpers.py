"""Run the real `argosy` CLI in a subprocess (`python -m argosy`), as a user would, or
its entry point in this process (`run_main`, for capsys and monkeypatch).

    done = argosy("health", "check", "--json")
    assert done.returncode == 0, done.stderr
    assert run_main(monkeypatch, "chips", "--set", "nope=1") == 2

The child runs from the repository root with a fixed terminal width, so rich tables wrap
the same way on every machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_gpt.py"


def argosy(
    *args: str,
    timeout: float = 180,
    columns: int = 100,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m argosy ARGS...`; stdout and stderr captured as text."""
    full_env = {**os.environ, "COLUMNS": str(columns), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "argosy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step as a run finally kept it (a redone step's last value wins)."""
    out = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            out[event["step"]] = event["loss"]
    return out


def summary(run_dir: Path) -> dict:
    """The run's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


def run_main(monkeypatch: Any, *args: str) -> int:  # noqa: ANN401  (pytest's MonkeyPatch)
    """The exit code of `argosy ARGS...` run through its console entry point here (which
    always ends in SystemExit)."""
    import pytest

    from argosy.cli.app import main

    monkeypatch.setattr("sys.argv", ["argosy", *args])
    with pytest.raises(SystemExit) as done:
        main()
    return int(done.value.code or 0)
