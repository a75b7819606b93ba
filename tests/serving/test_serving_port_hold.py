"""`argosy serve` holds its port from its first moment: it binds and listens before the
model loads (503 `loading` meanwhile, `/live` 200 only once loaded), a port another
process holds fails it at once (exit 2, one line naming the port, nothing loaded), and
`/live?nonce=N` answers the replica's proof under the key `argosy server` handed it."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from argosy.serving.admin import MAX_NONCE_CHARS, PROOF_KEY_ENV, proof_matches, replica_proof
from argosy.serving.api import build_app

KEY = b"0123456789abcdef" * 4
LOCAL = "http://127.0.0.1"  # a Host the browser guard of a keyless service answers
SERVE = [sys.executable, "-m", "argosy", "serve", "--speculative", "off", "--threads", "1"]


def test_live_answers_the_proof_of_the_address_it_was_started_for() -> None:
    app = build_app(FakeEngine(), "fake", proof_key=KEY, address="10.0.0.7:9100")
    with TestClient(app, base_url=LOCAL) as client:
        answer = client.get("/live", params={"nonce": "n-1"}).json()
        assert answer["status"] == "alive"
        assert proof_matches(KEY, "n-1", "10.0.0.7:9100", answer["proof"])
        assert answer["proof"] == replica_proof(KEY, "n-1", "10.0.0.7:9100")
        assert not proof_matches(KEY, "n-1", "10.0.0.7:9101", answer["proof"])
        assert client.get("/live").json() == {"status": "alive"}  # no nonce, no proof
        too_long = client.get("/live", params={"nonce": "n" * (MAX_NONCE_CHARS + 1)})
        assert too_long.status_code in (400, 422)
    with TestClient(build_app(FakeEngine(), "fake"), base_url=LOCAL) as client:  # no key
        assert client.get("/live", params={"nonce": "n-1"}).json() == {"status": "alive"}


def test_a_port_another_process_holds_fails_at_once_naming_it() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        start = time.monotonic()
        result = subprocess.run(
            [*SERVE, "--port", str(port)], capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in lines[0]
    assert "nothing was loaded" in lines[0]
    assert time.monotonic() - start < 60  # no model load first


def test_the_port_is_held_while_the_model_loads_and_live_proves_once_loaded(
    tmp_path: Path,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, **{PROOF_KEY_ENV: KEY.decode(), "ARGOSY_ADMIN_TOKEN": "admin-t"})
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*SERVE, "--port", str(port)], stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "loading" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        with socket.socket() as squatter, pytest.raises(OSError) as taken:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
        assert taken.value.errno == errno.EADDRINUSE
        loading = httpx.get(f"{url}/live", params={"nonce": "n-0"}, timeout=10)
        assert loading.status_code == 503 and loading.json() == {"status": "loading"}
        assert "proof" not in loading.text

        deadline = time.monotonic() + 180
        while (live := httpx.get(f"{url}/live", params={"nonce": "n-1"}, timeout=10)).is_error:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert proof_matches(KEY, "n-1", f"127.0.0.1:{port}", live.json()["proof"])
        state = httpx.get(f"{url}/admin/state", headers={"authorization": "Bearer admin-t"})
        worker = state.json()["pids"]["worker"]
        environ = Path(f"/proc/{worker}/environ").read_bytes()
        assert PROOF_KEY_ENV.encode() not in environ  # the engine's process never sees it
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
