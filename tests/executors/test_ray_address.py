"""A Ray address nobody answers is a clear error at server start, in seconds, not a minute
of gRPC retries inside `ray.init`."""

import os
import socket
import subprocess
import sys
import time

import pytest

from argosy.core.errors import ArgosyError
from argosy.executors import ray_address


def test_a_listening_head_is_reachable_and_auto_reads_ray_s_own_lookup(monkeypatch, tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ray_address.check_reachable(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        assert ray_address.check_reachable("auto") == f"127.0.0.1:{port}"
        monkeypatch.delenv("RAY_ADDRESS")
        recorded = tmp_path / "ray_current_cluster"
        recorded.write_text(f"127.0.0.1:{port}\n")
        monkeypatch.setattr(ray_address, "CURRENT_CLUSTER", recorded)
        assert ray_address.check_reachable(None) == f"127.0.0.1:{port}"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends


@pytest.mark.parametrize("form", ["{port}", "ray://127.0.0.1:{port}", "127.0.0.1:{port}"])
def test_nothing_answering_is_an_error_naming_the_address_and_the_fix(form):
    port = _closed_port()
    address = form.format(port=port) if form != "{port}" else f"127.0.0.1:{port}"
    with pytest.raises(ArgosyError, match=rf"127.0.0.1:{port}.*ray start --head"):
        ray_address.check_reachable(address, timeout_s=1.0)


@pytest.mark.parametrize("source", ["flag", "env", "record"])
def test_a_dead_address_says_where_it_came_from(monkeypatch, tmp_path, source):
    """`auto` on a host whose last cluster died uncleanly finds the stale record: the
    error names that file (and how it goes away), not just an address nobody knows."""
    address = f"127.0.0.1:{_closed_port()}"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    recorded = tmp_path / "ray_current_cluster"
    monkeypatch.setattr(ray_address, "CURRENT_CLUSTER", recorded)
    if source == "env":
        monkeypatch.setenv("RAY_ADDRESS", address)
    elif source == "record":
        recorded.write_text(address + "\n")
    want = {"flag": "--ray-address", "env": r"\$RAY_ADDRESS", "record": f"{recorded}.*ray stop"}
    with pytest.raises(ArgosyError, match=rf"address is from {want[source]}"):
        ray_address.check_reachable(address if source == "flag" else "auto", timeout_s=1.0)


@pytest.mark.parametrize("bad", ["127.0.0.1:http", "127.0.0.1:0", "host:70000"])
def test_a_malformed_address_is_refused(bad):
    with pytest.raises(ArgosyError, match="HOST:PORT"):
        ray_address.resolve(bad)


def test_auto_without_any_cluster_says_none_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_address, "CURRENT_CLUSTER", tmp_path / "absent")
    with pytest.raises(ArgosyError, match="no Ray cluster is running"):
        ray_address.resolve("auto")


def test_the_server_exits_2_at_once_on_an_address_nobody_answers(tmp_path):
    port = _closed_port()
    start = time.monotonic()
    cmd = [sys.executable, "-m", "argosy", "server", "--executor", "ray", "--home", str(tmp_path)]
    cmd += ["--ray-address", f"127.0.0.1:{port}", "--port", "0", "--allow-root-jobs"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - start < 60  # a bound, not a speed check: ray.init waits minutes


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user needs root to make")
def test_a_recorded_address_of_another_user_is_refused(tmp_path, monkeypatch) -> None:
    """Ray leaves /tmp/ray open to everyone: a job on the head could replace the record
    with its own address and take the token the server sends there."""
    recorded = tmp_path / "ray_current_cluster"
    recorded.write_text("127.0.0.1:47001\n")
    os.chown(recorded, 65534, 65534)
    monkeypatch.setattr(ray_address, "CURRENT_CLUSTER", recorded)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ArgosyError, match="--ray-address"):
        ray_address.resolve("auto")
    os.chown(recorded, 0, 0)
    assert ray_address.resolve("auto") == "127.0.0.1:47001"
