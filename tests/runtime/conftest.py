"""Shared fixture of the runtime tests: one fault-free run to compare faulty runs with."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import EXAMPLE, argosy


@pytest.fixture(scope="session")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fault-free 2-rank run of the example, shared by the tests that compare with it."""
    run = tmp_path_factory.mktemp("fault-free")
    done = argosy(
        "launch",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run),
        str(EXAMPLE),
        "--steps",
        "40",
        "--ckpt-every",
        "5",
    )
    assert done.returncode == 0, done.stderr
    return run
