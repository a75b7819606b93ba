"""A replica probe ends within its wall-clock deadline, whatever the port's owner sends."""

from __future__ import annotations

import json
import socket
import threading
import time

from argosy.server.replica_probe import DOWN, PROVEN, UNPROVEN, probe_health, replica_proof_key
from argosy.serving.admin import replica_proof


def _serve(handler) -> tuple[socket.socket, int]:  # noqa: ANN001
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener, listener.getsockname()[1]


def _trickle(conn: socket.socket) -> None:
    with conn:
        conn.recv(4096)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(100):
                time.sleep(0.2)
                conn.sendall(b"x")
        except OSError:
            return


def test_a_trickling_port_holds_a_probe_no_longer_than_its_deadline() -> None:
    listener, port = _serve(_trickle)
    with listener:
        start = time.monotonic()
        found = probe_health(f"http://127.0.0.1:{port}/live", b"k", f"127.0.0.1:{port}", 1.0)
        took = time.monotonic() - start
    assert found == DOWN
    assert took < 1.8, took


def test_the_replica_is_proven_and_a_stranger_is_not() -> None:
    key = replica_proof_key(b"secret", "s0123456789ab")

    def answer(conn: socket.socket) -> None:
        with conn:
            head = conn.recv(4096).decode()
            nonce = head.split("nonce=", 1)[1].split()[0]
            where = f"127.0.0.1:{conn.getsockname()[1]}"
            body = json.dumps({"proof": replica_proof(key, nonce, where)}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)

    listener, port = _serve(answer)
    with listener:
        url, where = f"http://127.0.0.1:{port}/live", f"127.0.0.1:{port}"
        assert probe_health(url, key, where) == PROVEN
        assert probe_health(url, b"other", where) == UNPROVEN
