"""Helpers of the server tests: config for a fast loop, job bodies, waiting on states."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from argosy.server.config import ServerConfig

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = str(SCRIPTS / "steps.py")
TERMINAL = {"succeeded", "failed", "cancelled"}


def fast_config(home: Path, **kw: object) -> ServerConfig:
    values = {"home": home, "local_slots": 2, "poll_interval_s": 0.05, "cycle_interval_s": 0.2}
    return ServerConfig.model_validate(values | kw)


def job_body(name: str = "t", **kw: object) -> dict:
    return {"name": name, "script": STEPS, "args": ["--steps", "2"]} | kw


def wait_for(client: Any, job_id: str, states: set[str], timeout_s: float = 30.0) -> dict:
    """Poll the job (TestClient or httpx.Client with base URL) until it is in `states`."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            assert job["state"] in states, job
            return job
        time.sleep(0.05)
