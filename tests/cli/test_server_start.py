"""`argosy server` start-up: bad input is one line and exit 2, the port's owner is named,
and the listening line comes only once the server listens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from argosy.core.listeners import PortHeldError, bind_listening, companion_addresses


def _server(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"ARGOSY_HOME": str(home), "PYTHONPATH": os.getcwd()}
    command = [sys.executable, "-m", "argosy", "server", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--queues", "bad.yaml", "malformed YAML"),
        ("--db", "nope://x", "cannot open the store"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, flag: str, value: str, said: str) -> None:
    (tmp_path / "bad.yaml").write_text("queues: [\n")
    if flag == "--queues":
        value = str(tmp_path / value)
    r = _server(tmp_path / "home", "--port", str(_free_port()), flag, value)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr
    assert "Traceback" not in r.stderr
    assert "argosy server on" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0], r.stderr


def test_a_held_port_is_refused_naming_its_owner(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _server(tmp_path / "home", "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and f"uid {os.getuid()}" in r.stderr
    assert "Traceback" not in r.stderr and "argosy server on" not in r.stderr


def test_a_loopback_server_holds_the_other_loopback_family_too() -> None:
    assert companion_addresses("127.0.0.1") == ["127.0.0.1", "::1"]
    assert companion_addresses("localhost") == ["localhost", "::1"]
    assert companion_addresses("::1") == ["::1", "127.0.0.1"]
    assert companion_addresses("10.0.0.5") == ["10.0.0.5"]


def test_bind_listening_takes_both_loopbacks_where_ipv6_exists() -> None:
    sockets = bind_listening("127.0.0.1", 0)
    try:
        port = sockets[0].getsockname()[1]
        families = {s.family for s in sockets}
        assert socket.AF_INET in families
        if socket.has_ipv6 and _ipv6_loopback():
            assert socket.AF_INET6 in families
            with pytest.raises(OSError), socket.socket(socket.AF_INET6) as other:
                other.bind(("::1", port))  # what a job would do beside the server
    finally:
        for s in sockets:
            s.close()


def test_a_held_port_names_its_owner_uid() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortHeldError) as err:
            bind_listening("127.0.0.1", port)
    assert err.value.uids == {os.getuid()}
    assert f"uid {os.getuid()}" in str(err.value)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True
