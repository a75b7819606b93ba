"""Helpers of the server tests: config for a fast loop, job bodies, waiting on states."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from argosy.core.net import free_port
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = str(SCRIPTS / "steps.py")
WORKDIR = str(SCRIPTS)
"""An absolute workdir the API admits (submit refuses a missing or relative one)."""
TERMINAL = {"succeeded", "failed", "cancelled"}


ROOT_JOBS = ("--allow-root-jobs",) if os.geteuid() == 0 else ()
"""These servers test other things than isolation (tests/server/test_tenant_escape.py
does): under root their jobs run as root, in run directories under the test's home."""


def fast_config(home: Path, **kw: object) -> ServerConfig:
    values = {"home": home, "local_slots": 2, "poll_interval_s": 0.05, "cycle_interval_s": 0.2}
    values["allow_root_jobs"] = True
    return ServerConfig.model_validate(values | kw)


NODES = [NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)]
"""The two nodes of the `api` fixture's server (conftest.py)."""


def app_client(home: Path, fake: FakeExecutor) -> Any:
    """A TestClient of a server on `home` whose executor is `fake`."""
    from fastapi.testclient import TestClient

    from argosy.server.app import create_app

    return TestClient(create_app(fast_config(home), executor=fake))


def job_body(name: str = "t", **kw: object) -> dict:
    return {"name": name, "script": STEPS, "args": ["--steps", "2"], "workdir": WORKDIR} | kw


def wait_for(client: Any, job_id: str, states: set[str], timeout_s: float = 30.0) -> dict:
    """Poll the job (TestClient or httpx.Client with base URL) until it is in `states`."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            assert job["state"] in states, job
            return job
        time.sleep(0.05)


class ServerProcess:
    """`argosy server` as a real process on a free port (start, SIGKILL, start again)."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra
        self.proc: Any = None
        self.root_jobs = True
        """Under root, run jobs as root (`--allow-root-jobs`); False: as the server's
        default, unprivileged users."""

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the server and wait for /health: a wait, not a speed check (a start took
        28 s of its former 30 s limit at load 9 on 2 cores)."""
        import os
        import subprocess
        import sys

        import httpx

        command = [sys.executable, "-m", "argosy", "server", "--port", str(self.port)]
        command += ["--home", str(self.home), "--slots", "2", *self.extra]
        command += ROOT_JOBS if self.root_jobs else ()
        log = (self.home.parent / f"server-{self.port}.log").open("ab")
        env = dict(os.environ, ARGOSY_HOME=str(self.home))
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the server exited at start"
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not answer /health")

    def kill(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def client(self) -> Any:
        import httpx

        token = (self.home / "admin.token").read_text().strip()
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"})

    def env(self) -> dict[str, str]:
        import os

        return dict(os.environ, ARGOSY_HOME=str(self.home), ARGOSY_SERVER=self.url)


def running_server(home: Path, *extra: str) -> Iterator[ServerProcess]:
    """A started `ServerProcess` on `home`, killed when the generator closes: the body of
    a module-scoped server fixture (`yield from running_server(...)`)."""
    server = ServerProcess(home, *extra)
    server.start()
    try:
        yield server
    finally:
        server.kill()
