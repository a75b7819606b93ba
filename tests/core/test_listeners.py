"""Who listens on a port of this host (argosy.core.listeners): the kernel's socket tables
parsed, a listener of this process found as its own user's, one of another user refused
before Ray's token is sent to it, and an address of another host left alone."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from argosy.core.errors import ArgosyError
from argosy.core.listeners import anyone_may_bind, listener_uids, parse_listeners
from argosy.executors import ray_address

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000  2001        0 2 1
   2: 0100007F:18EB 0100007F:D431 01 00000000:00000000 00:00000000 00000000  2001        0 3 1
   3: garbled
"""
TABLE6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 0 0 0 7 0
"""


def test_the_kernel_s_tables_are_read_as_listeners_with_their_owners() -> None:
    assert parse_listeners(TABLE) == [
        (ipaddress.ip_address("127.0.0.1"), 6379, 0),
        (ipaddress.ip_address("0.0.0.0"), 80, 2001),
    ]  # the connected socket (state 01) and the garbled line are not listeners
    assert parse_listeners(TABLE6) == [(ipaddress.ip_address("::1"), 8080, 7)]


def test_a_listener_of_this_process_is_its_own_user_s_and_passes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listener_uids("127.0.0.1", port) == {os.geteuid()}
        assert listener_uids("localhost", port) == {os.geteuid()}
        assert ray_address.check_reachable(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
    assert listener_uids("127.0.0.1", port) == set()  # closed: nobody
    assert listener_uids("192.0.2.1", port) == set()  # not this host's: not known here


@pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another user needs root")
def test_a_port_held_by_another_user_is_refused_before_a_token_goes_to_it() -> None:
    """With the head down, a job on the head's host binds its GCS port: the server must
    not send its Ray token there (the check runs before any gRPC call)."""
    code = (
        "import os, socket, time; os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
    )
    impostor = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert impostor.stdout is not None
        port = int(impostor.stdout.readline())
        assert listener_uids("127.0.0.1", port) == {65534}
        with pytest.raises(ArgosyError, match="uid 65534, neither root nor"):
            ray_address.check_reachable(f"127.0.0.1:{port}")
        where = f"127.0.0.1:{port}"  # a head started as a dedicated user, named as such
        assert ray_address.check_reachable(where, head_uids=(65534,)) == where
    finally:
        impostor.kill()
        impostor.wait()


@pytest.mark.parametrize(
    ("host", "port", "sysctl", "want"),
    [
        ("127.0.0.1", 6379, "1024\n", True),  # the default GCS port: a job may take it
        ("127.0.0.1", 637, "1024\n", False),  # privileged: only root binds it
        ("127.0.0.1", 637, "0\n", True),  # an admin opened every port to every user
        ("127.0.0.1", 6379, "", True),  # unreadable: Linux's default, 1024
        ("192.0.2.7", 6379, "1024\n", False),  # another host's port: not this kernel's
    ],
)
def test_anyone_may_bind_a_port_of_this_host_at_or_past_the_unprivileged_start(
    tmp_path: Path, host: str, port: int, sysctl: str, want: bool
) -> None:
    path = tmp_path / "ip_unprivileged_port_start"
    path.write_text(sysctl)
    assert anyone_may_bind(host, port, sysctl=path) is want


def test_the_server_warns_of_a_head_port_a_job_could_take(capsys: pytest.CaptureFixture) -> None:
    from argosy.cli.server import warn_takeable_head

    warn_takeable_head("192.0.2.7:6379")  # another host: its kernel's business
    assert capsys.readouterr().err == ""
    warn_takeable_head("127.0.0.1:6379")  # 6379 >= any unprivileged start there is
    err = capsys.readouterr().err
    assert "127.0.0.1:6379" in err and "port below 1024" in err
