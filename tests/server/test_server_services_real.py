"""A service end to end: a real `argosy server` process, the local executor and the real
`argosy serve` (smollm2-135m from its local cache): `argosy submit service.yaml`, the
replica answers the OpenAI API, a killed replica is restarted, delete frees its device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import ServerProcess

from argosy.executors.local import kill_job_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE_YAML = """\
kind: service
name: chat
model: smollm2-135m
replicas: 1
speculative: "off"
threads: 1
max_restarts: 2
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "home")
    proc.start()
    yield proc
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=30)
    for replica in (proc.home / "runs").glob("s*/r*"):  # replicas outlive their server
        kill_job_processes(f"{replica.parent.name}.{replica.name}")


def argosy(server: ServerProcess, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "argosy", *args]
    env = server.env() | {"COLUMNS": "200"}
    return subprocess.run(command, capture_output=True, text=True, env=env)


def wait_ready(client: httpx.Client, sid: str, attempt: int, timeout_s: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        data = client.get(f"/api/v1/services/{sid}").json()
        replica = data["replicas"][0] if data["replicas"] else {}
        if data["state"] == "running" and replica.get("attempt") == attempt:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.25)


def test_a_service_serves_restarts_and_is_deleted(server: ServerProcess, tmp_path: Path) -> None:
    (tmp_path / "service.yaml").write_text(SERVICE_YAML)
    submitted = argosy(server, "submit", str(tmp_path / "service.yaml"), "--json")
    assert submitted.returncode == 0, submitted.stderr
    sid = json.loads(submitted.stdout)["id"]
    client = server.client()
    data = wait_ready(client, sid, attempt=1)
    key = client.get(f"/api/v1/services/{sid}/key").json()["api_key"]
    assert httpx.get(f"{data['endpoints'][0]}/models", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    models = httpx.get(f"{data['endpoints'][0]}/models", headers=auth, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["smollm2-135m"]

    attempt_dir = server.home / "runs" / sid / "r0" / "server" / "attempt1"
    os.kill(int((attempt_dir / "launch.pid").read_text()), signal.SIGKILL)
    data = wait_ready(client, sid, attempt=2)
    assert data["replicas"][0]["restarts"] == 1

    listed = argosy(server, "services")
    assert listed.returncode == 0 and sid in listed.stdout and "1/1" in listed.stdout
    deleted = argosy(server, "service", sid, "--delete", "--json")
    assert deleted.returncode == 0, deleted.stderr
    deadline = time.monotonic() + 30
    while client.get(f"/api/v1/services/{sid}").json()["state"] != "deleted":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{data['endpoints'][0]}/models", headers=auth, timeout=2)
    node = client.get("/api/v1/nodes").json()[0]
    assert node["free"] == node["devices"]
    kinds = [e["kind"] for e in client.get(f"/api/v1/services/{sid}/events").json()["items"]]
    assert kinds.count("replica_ready") == 2 and "replica_exited" in kinds
    assert kinds[-1] == "deleted"
