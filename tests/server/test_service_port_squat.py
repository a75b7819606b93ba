"""Another tenant cannot squat a replica's port: the control plane takes a replica as
ready only when its `/live` answer carries the replica's proof (the HMAC of a fresh nonce
and the replica's `host:port` under its service's proof key), so a process that took the
port first is never `ready` and the service never `running` through it; the real
`argosy serve` binds its port before loading anything, and fails at once naming it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.service_spec import ServiceSpec
from argosy.server.services import (
    DOWN,
    PROVEN,
    UNPROVEN,
    probe_health,
    replica_proof_key,
)
from argosy.server.store import Store
from argosy.server.views import service_view
from argosy.serving.admin import PROOF_KEY_ENV, proof_matches, replica_proof

Answer = Callable[[str | None], tuple[int, dict]]
"""What a stand-in on the port answers a `/live?nonce=` probe: (status, JSON body)."""


def squatter(nonce: str | None) -> tuple[int, dict]:
    """A hostile process on the port: 200, as a replica would, and a made-up proof."""
    return 200, {"status": "alive", "proof": "0" * 64}


@contextmanager
def on_port(answer: Answer, port: int = 0) -> Iterator[int]:
    """An HTTP server on 127.0.0.1 (`port`, 0: a free one) answering with `answer`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            nonce = parse_qs(urlparse(self.path).query).get("nonce", [None])[0]
            status, body = answer(nonce)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the proof ------------------------------------------------------------------------
def test_the_proof_holds_only_for_the_right_key_nonce_and_address() -> None:
    key = replica_proof_key(b"server secret", "s0123456789ab")
    where = "127.0.0.1:9100"
    answer = replica_proof(key, "nonce-1", where)
    assert proof_matches(key, "nonce-1", where, answer)
    assert key.decode() not in answer  # the key itself never crosses the wire
    other_server = replica_proof_key(b"another secret", "s0123456789ab")
    other_service = replica_proof_key(b"server secret", "s0000000000ab")
    assert other_server != key and other_service != key
    assert not proof_matches(other_server, "nonce-1", where, answer)
    assert not proof_matches(other_service, "nonce-1", where, answer)
    assert not proof_matches(key, "nonce-2", where, answer)  # replayed for a new nonce
    assert not proof_matches(key, "nonce-1", "127.0.0.1:9101", answer)  # another replica's
    assert not proof_matches(key, "nonce-1", where, "")
    assert not proof_matches(key, "nonce-1", where, "0" * 64)


def test_probe_health_tells_the_replica_from_whatever_else_holds_its_port() -> None:
    key = replica_proof_key(b"server secret", "s0123456789ab")

    def replica(where: str) -> Answer:
        return lambda nonce: (200, {"status": "alive", "proof": replica_proof(key, nonce, where)})

    port = free_port()
    where = f"127.0.0.1:{port}"
    url = f"http://{where}/live"
    with on_port(replica(where), port):
        assert probe_health(url, key, where) == PROVEN
        assert probe_health(url, replica_proof_key(b"x", "s0123456789ab"), where) == UNPROVEN
    with on_port(replica("127.0.0.1:1"), port):  # a proof made for another port
        assert probe_health(url, key, where) == UNPROVEN
    with on_port(lambda nonce: (200, {"status": "alive"}), port):  # a plain 200
        assert probe_health(url, key, where) == UNPROVEN
    with on_port(squatter, port):
        assert probe_health(url, key, where) == UNPROVEN
    with on_port(lambda nonce: (503, {"status": "loading"}), port):
        assert probe_health(url, key, where) == DOWN
    assert probe_health(url, key, where) == DOWN  # nothing listens
    with socket.socket() as raw:  # not HTTP at all: DOWN, no exception
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        raw.bind(("127.0.0.1", port))
        raw.listen()
        garbage = threading.Thread(target=lambda: raw.accept()[0].sendall(b"garbage\r\n\r\n"))
        garbage.start()
        assert probe_health(url, key, where) == DOWN
        garbage.join()


# ---- the control plane ----------------------------------------------------------------
@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[tuple[Control, FakeExecutor]]:
    """A control loop over the fake executor with the real probe (`probe_health`)."""
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2)])
    config = ServerConfig(home=tmp_path, min_cycle_gap_s=0.0, nodes_interval_s=1e9)
    ctl = Control(config, Store(config.database_url), fake, clock=FakeClock())
    ctl.services.health_interval_s = 0.0
    ctl.recover()
    yield ctl, fake
    ctl.services.close()
    ctl.store.close()


def run_for(ctl: Control, sid: str, seconds: float, until: Callable[[dict], bool]) -> list[dict]:
    """Step the loop until `until(view)` or `seconds` pass; every view seen."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctl.poke()
        ctl.step()
        seen.append(service_view(ctl.service(sid)).model_dump())
        if until(seen[-1]):
            break
        time.sleep(0.01)
    return seen


def kinds(ctl: Control, sid: str) -> list[str]:
    return [e["kind"] for e in ctl.store.list_events(job_id=sid, cursor=0, limit=100)[0]]


def test_a_port_that_answers_200_without_the_proof_is_never_taken_as_the_replica(
    ctl: tuple[Control, FakeExecutor],
) -> None:
    control, fake = ctl
    port = free_port()
    with on_port(squatter, port):
        sid = control.submit_service(ServiceSpec(name="chat", port=port))["id"]
        seen = run_for(control, sid, 1.5, lambda v: v["state"] == "running")
        assert len(seen) > 10 and f"{sid}.r0" in fake.running  # probed again and again
        assert {v["state"] for v in seen} == {"starting"}
        assert {r["state"] for v in seen for r in v["replicas"]} == {"starting"}
        assert all(v["endpoints"] == [] and v["replicas"][0]["url"] is None for v in seen)
        assert "replica_unproven" in kinds(control, sid)
        assert "replica_ready" not in kinds(control, sid)

        control.services.unproven_grace_s = 0.0  # past the grace: stopped, once per attempt
        seen = run_for(control, sid, 10, lambda v: v["state"] == "failed")
    assert seen[-1]["state"] == "failed", seen[-1]
    assert "running" not in {v["state"] for v in seen}
    reason = seen[-1]["reason"]
    assert f"port {port} on n0 answered without the replica's proof" in reason, reason
    assert "the same way twice in a row before it was ready" in reason
    assert fake.started == [(f"{sid}.r0", 1), (f"{sid}.r0", 2)]
    assert "replica_ready" not in kinds(control, sid)


def test_the_replica_with_its_proof_key_is_ready_and_only_then_shown(
    ctl: tuple[Control, FakeExecutor],
) -> None:
    control, fake = ctl
    port = free_port()
    sid = control.submit_service(ServiceSpec(name="chat", port=port))["id"]
    run_for(control, sid, 0.2, lambda v: False)
    request = fake.running[f"{sid}.r0"]
    key = request.env[PROOF_KEY_ENV].encode()  # what `argosy serve` reads
    assert key.decode() not in " ".join(request.command)  # never on the command line
    where = f"127.0.0.1:{port}"
    view = service_view(control.service(sid)).model_dump()
    assert view["state"] == "starting" and view["replicas"][0]["url"] is None

    def replica(nonce: str | None) -> tuple[int, dict]:
        return 200, {"status": "alive", "proof": replica_proof(key, nonce or "", where)}

    with on_port(replica, port):
        seen = run_for(control, sid, 10, lambda v: v["state"] == "running")
    assert seen[-1]["state"] == "running", seen[-1]
    assert seen[-1]["endpoints"] == [f"http://{where}/v1"]
    assert "replica_unproven" not in kinds(control, sid)


# ---- real replicas ----------------------------------------------------------------------
@pytest.mark.integration
def test_a_squatted_port_fails_the_real_replica_naming_it_and_never_runs(
    client: TestClient,
) -> None:
    """The local executor starts the real `argosy serve` on a port another process took
    first (and answers 200 on): it fails at once naming the port, twice, and the service
    fails with that line; it is never `running`, its replica never `ready`."""
    port = free_port()
    with on_port(squatter, port):
        body = {"name": "squat", "port": port, "speculative": "off", "threads": 1}
        sid = client.post("/api/v1/services", json=body).json()["id"]
        seen, deadline = [], time.monotonic() + 120
        while (view := client.get(f"/api/v1/services/{sid}").json())["state"] != "failed":
            seen.append(view)
            assert time.monotonic() < deadline, view
            time.sleep(0.05)
    assert "running" not in {v["state"] for v in seen}
    assert "ready" not in {r["state"] for v in seen for r in v["replicas"]}
    assert all(r["url"] is None for v in seen for r in v["replicas"])
    reason = view["reason"]
    assert f"port {port} on 127.0.0.1 is already in use" in reason, reason
    assert "nothing was loaded" in reason and "the same way twice" in reason
    events = client.get(f"/api/v1/services/{sid}/events").json()["items"]
    assert "replica_ready" not in [e["kind"] for e in events]


def test_the_tidal_lease_sends_a_replica_its_admin_token_only_after_its_proof() -> None:
    """Waking or yielding a tidal replica carries its admin token: what holds the port
    without the replica's proof (a squatter after the replica died asleep) is refused
    before any POST, and the real replica is proven, then called."""
    from argosy.core.errors import ArgosyError
    from argosy.server.tidal import HttpReplicaAdmin

    key = replica_proof_key(b"server secret", "s0123456789ab")
    admin = HttpReplicaAdmin(timeout_s=5)
    port = free_port()
    where = f"127.0.0.1:{port}"
    with on_port(squatter, port), pytest.raises(ArgosyError, match="without the replica's"):
        admin.prove(f"http://{where}", key, where)
    with on_port(lambda nonce: (200, {"proof": replica_proof(key, nonce, where)}), port):
        admin.prove(f"http://{where}", key, where)  # proven: no error
    with pytest.raises(ArgosyError, match="is down"):
        admin.prove(f"http://{where}", key, where)
