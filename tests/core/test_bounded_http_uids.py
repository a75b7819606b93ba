"""Loopback clients are counted by the uid owning the connecting socket, not by address:
one local user cannot take every connection by spreading over 127.0.0.0/8, and root and
the server's own user are not locked out by others' connections."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("uvicorn")
from test_bounded_http import serving  # noqa: E402

from argosy.core import bounded_http  # noqa: E402
from argosy.core.listeners import socket_uid  # noqa: E402

UIDS = {"127.0.0.2": 1001, "127.0.0.3": 1001, "127.0.0.4": 1002, "127.0.0.5": 0}
"""Source address -> the uid the test says owns sockets from it (None: unknown)."""
REQUEST = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"


async def ok(scope, receive, send) -> None:  # noqa: ANN001
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    protocol = bounded_http.protocol_class(
        max_per_client=2, uid_of=lambda ip, port, to: UIDS.get(ip)
    )
    if protocol is None:
        pytest.skip("uvicorn without httptools: no per-client cap")
    with serving(ok, http=protocol, timeout_keep_alive=60) as free:
        yield free


def _open(port: int, source: str, held: list[socket.socket]) -> bytes:
    """A kept-open connection from `source`: the first bytes of its answer."""
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    held.append(sock)
    sock.sendall(REQUEST)
    return sock.recv(4096)


def test_one_uid_is_one_client_across_loopback_addresses(port: int) -> None:
    held: list[socket.socket] = []
    try:
        assert _open(port, "127.0.0.2", held).startswith(b"HTTP/1.1 200")
        assert _open(port, "127.0.0.3", held).startswith(b"HTTP/1.1 200")
        third = _open(port, "127.0.0.2", held)  # uid 1001's third: past its cap of 2
        assert third.startswith(b"HTTP/1.1 503") and b"uid 1001" in third
        assert _open(port, "127.0.0.4", held).startswith(b"HTTP/1.1 200")  # another uid
    finally:
        for sock in held:
            sock.close()


def test_unknown_uids_share_one_client(port: int) -> None:
    held: list[socket.socket] = []
    try:
        assert _open(port, "127.0.0.6", held).startswith(b"HTTP/1.1 200")
        assert _open(port, "127.0.0.7", held).startswith(b"HTTP/1.1 200")
        assert _open(port, "127.0.0.8", held).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()


def test_root_and_the_servers_user_are_not_capped(port: int) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(4):
            assert _open(port, "127.0.0.5", held).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


def test_the_kernel_names_the_uid_of_a_connecting_socket() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another uid")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        code = (
            "import os,socket,time\nos.setgid(65534); os.setuid(65534)\n"
            f"c=socket.create_connection(('127.0.0.1',{listener.getsockname()[1]}))\n"
            "time.sleep(5)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            conn, peer = listener.accept()
            with conn:
                assert socket_uid(*peer, to=conn.getsockname()) == 65534
                assert socket_uid(*peer, to=("127.0.0.1", 1)) is None  # another connection
        finally:
            proc.kill()
            proc.wait()


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def _row(local: str, remote: str, state: str, uid: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid} 0 1\n"


def test_socket_owners_read_once_per_burst_and_again_for_a_new_socket(tmp_path) -> None:  # noqa: ANN001
    from argosy.core.listeners import SocketOwners

    v4, v6 = tmp_path / "tcp", tmp_path / "tcp6"
    server = "0100007F:1F90"  # 127.0.0.1:8080
    v4.write_text(HEADER + _row("0200007F:9C40", server, "01", 2001))  # 127.0.0.2:40000
    v6.write_text(HEADER)
    owners = SocketOwners((v4, v6), max_age_s=60)
    assert owners.uid("127.0.0.2", 40000, ("127.0.0.1", 8080)) == 2001
    v4.write_text(  # a TIME_WAIT row of the same address is no one's
        HEADER
        + _row("0200007F:9C40", server, "01", 2001)
        + _row("0300007F:9C41", server, "06", 0)
        + _row("0300007F:9C41", server, "01", 2002)
    )
    assert owners.uid("127.0.0.3", 40001, ("127.0.0.1", 8080)) == 2002  # read again
    assert owners.uid("127.0.0.9", 1, ("127.0.0.1", 8080)) is None
