"""The bounded-head HTTP protocol: heads over the limit get a 431 and a closed connection;
bodies, heads under the limit and keep-alive requests after them are served as before."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

uvicorn = pytest.importorskip("uvicorn")
from argosy.core.bounded_http import MAX_HEAD_BYTES, protocol_class  # noqa: E402


async def echo_length(scope, receive, send) -> None:  # noqa: ANN001
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    protocol = protocol_class()
    if protocol is None:
        pytest.skip("uvicorn without httptools: h11's own limit applies")
    with serving(echo_length, http=protocol) as free:
        yield free


@contextlib.contextmanager
def serving(app, **config: object) -> Iterator[int]:  # noqa: ANN001
    """`app` under uvicorn on a free port of 127.0.0.1 (its `config` given), until exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    options = {"host": "127.0.0.1", "port": free, "log_level": "warning"} | config
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield free
    finally:
        server.should_exit = True
        thread.join(10)


def request(head_extra: int = 0, body: bytes = b"", close: bool = True) -> bytes:
    pad = f"x-pad: {'a' * head_extra}\r\n" if head_extra else ""
    end = "connection: close\r\n" if close else ""
    head = f"POST / HTTP/1.1\r\nhost: t\r\n{pad}{end}content-length: {len(body)}\r\n\r\n"
    return head.encode() + body


def exchange(port: int, payload: bytes) -> bytes:
    """Everything the server answers until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(payload)  # a refused head may close before it is all sent
        out = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                out += chunk
        return out


def test_a_head_over_the_limit_is_refused_and_the_server_still_answers(port: int) -> None:
    out = exchange(port, request(head_extra=4 * 1024 * 1024))
    assert out.startswith(b"HTTP/1.1 431"), out[:200]
    assert f"exceed {MAX_HEAD_BYTES} bytes".encode() in out
    assert exchange(port, request(body=b"ok")).startswith(b"HTTP/1.1 200")


def test_bodies_and_heads_under_the_limit_are_served(port: int) -> None:
    big_body = b"b" * (512 * 1024)
    out = exchange(port, request(body=big_body))
    assert out.startswith(b"HTTP/1.1 200") and f"\r\n{len(big_body)}\r\n".encode() in out
    out = exchange(port, request(head_extra=MAX_HEAD_BYTES - 1024))
    assert out.startswith(b"HTTP/1.1 200"), out[:200]


def test_each_keep_alive_request_gets_its_own_allowance(port: int) -> None:
    half = MAX_HEAD_BYTES * 3 // 4
    out = exchange(port, request(head_extra=half, close=False) + request(head_extra=half))
    assert out.count(b"HTTP/1.1 200") == 2, out[:400]
