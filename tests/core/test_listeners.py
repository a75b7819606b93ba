"""Who listens on a port of this host (argosy.core.listeners): the kernel's socket tables
parsed, a listener of this process found as its own user's, one of another user refused
before Ray's token is sent to it, and an address of another host left alone."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys

import pytest

from argosy.core.errors import ArgosyError
from argosy.core.listeners import listener_uids, parse_listeners
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
