"""The bounded HTTP protocol's timers and `run`'s limits: a silent or slow head and a
stalled body are cut within their bounds (also on a keep-alive connection), while a slow
application and a steady body are not; `run` sets keep-alive and concurrency limits and
raises the open-files limit."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

uvicorn = pytest.importorskip("uvicorn")
from test_bounded_http import serving  # noqa: E402

from argosy.core import bounded_http  # noqa: E402

HEAD_S = 0.5
BODY_S = 0.5
RATE = 1000  # bytes/s: each 1000 bytes of body buy one more second
SLACK_S = 4.0  # how much later than its bound a cut may come on a loaded test machine


async def app(scope, receive, send) -> None:  # noqa: ANN001
    """Echoes the body's length; `/slow` first sleeps past every timer's bound."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["path"] == "/slow":
        await asyncio.sleep(3 * max(HEAD_S, BODY_S))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    protocol = bounded_http.protocol_class(
        head_timeout_s=HEAD_S, body_timeout_s=BODY_S, min_body_bytes_per_s=RATE
    )
    if protocol is None:
        pytest.skip("uvicorn without httptools: no timers")
    with serving(app, http=protocol, timeout_keep_alive=60) as free:
        yield free


def until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sends until it closes, and when it closed (monotonic)."""
    sock.settimeout(HEAD_S + BODY_S + SLACK_S + 5)
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out, time.monotonic()


def test_a_silent_connection_is_closed_within_the_head_bound(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        out, closed = until_closed(s)
    assert out == b""  # nothing was asked, nothing is answered
    assert HEAD_S * 0.8 <= closed - start < HEAD_S + SLACK_S


def test_a_partial_head_is_answered_408_and_closed_within_the_head_bound(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: ")
        out, closed = until_closed(s)
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert HEAD_S * 0.8 <= closed - start < HEAD_S + SLACK_S


def test_a_head_sent_a_byte_at_a_time_is_still_cut_at_the_bound(port: int) -> None:
    head = b"GET / HTTP/1.1\r\nhost: t\r\nx-pad: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for byte in head:  # each byte resets no timer
                s.sendall(bytes([byte]))
                time.sleep(0.02)
                if time.monotonic() - start > HEAD_S + SLACK_S:
                    break
        out, closed = until_closed(s)
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert closed - start < HEAD_S + SLACK_S


def test_a_stalled_body_is_answered_408_and_closed_within_the_body_bound(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n0123456789")
        start = time.monotonic()
        out, closed = until_closed(s)
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert b"request body slower than" in out
    assert BODY_S * 0.8 <= closed - start < BODY_S + 10 / RATE + SLACK_S


def test_the_head_bound_restarts_after_each_keep_alive_response(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        s.settimeout(10)
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        start = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n")  # the next head never ends
        out, closed = until_closed(s)
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert closed - start < HEAD_S + SLACK_S


def test_a_slow_application_and_a_steady_body_are_not_cut(port: int) -> None:
    # The app sleeps 3 x the bounds: no timer runs while a request is being answered.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        out, _ = until_closed(s)
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    # 0.8 s of body at twice the minimum rate: past body_timeout_s, but on pace.
    chunk, chunks = b"b" * int(RATE * 0.2), 8
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = f"POST / HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {len(chunk) * chunks}\r\n\r\n"  # noqa: E501
        s.sendall(head.encode())
        for _ in range(chunks):
            time.sleep(0.1)
            s.sendall(chunk)
        out, _ = until_closed(s)
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    assert f"\r\n{len(chunk) * chunks}\r\n".encode() in out


class FakeResource:
    RLIM_INFINITY = -1
    RLIMIT_NOFILE = 7

    def __init__(self, soft: int, hard: int) -> None:
        self.limits = (soft, hard)

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == self.RLIMIT_NOFILE and limits[1] == self.limits[1]
        self.limits = limits


@pytest.mark.parametrize(
    ("soft", "hard", "raised", "concurrency"),
    [(1024, 524288, 524288, bounded_http.LIMIT_CONCURRENCY), (1024, 1024, 1024, 1024 - 128)],
)
def test_run_raises_the_open_files_limit_and_sets_keep_alive_and_concurrency(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, raised: int, concurrency: int
) -> None:
    fake = FakeResource(soft, hard)
    monkeypatch.setitem(__import__("sys").modules, "resource", fake)
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    bounded_http.run(app, host="127.0.0.1", port=1, log_level="warning")
    assert fake.limits == (raised, hard)
    assert seen["app"] is app and seen["host"] == "127.0.0.1"
    assert seen["timeout_keep_alive"] == bounded_http.KEEP_ALIVE_S
    assert seen["limit_concurrency"] == concurrency
    assert seen["http"] is not None


def test_run_keeps_the_callers_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "resource", FakeResource(4096, 4096))
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    bounds = bounded_http.HttpBounds(keep_alive_s=2, limit_concurrency=100)
    bounded_http.run(app, bounds=bounds, limit_concurrency=50)
    assert seen["timeout_keep_alive"] == 2 and seen["limit_concurrency"] == 50


def test_without_httptools_the_listener_says_it_times_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn's h11 fallback has no head or body timers: an operator is told so."""
    monkeypatch.setattr(bounded_http, "protocol_class", lambda *a, **k: None)
    with caplog.at_level("WARNING", logger="argosy.core.bounded_http"):
        options = bounded_http.uvicorn_options()
    assert options["http"] == "h11"
    assert any("httptools is not installed" in r.message for r in caplog.records)


@pytest.mark.parametrize("cap", [1, 3])
def test_one_client_holds_at_most_its_share_of_connections(cap: int) -> None:
    """Past `max_per_client` open connections from one address, a new one is answered
    503 and closed; once one of them closes, the next is served again."""
    protocol = bounded_http.protocol_class(max_per_client=cap, trusted_uids=frozenset())
    if protocol is None:
        pytest.skip("uvicorn without httptools: no per-client cap")
    with serving(app, http=protocol, timeout_keep_alive=60) as free:
        held = [socket.create_connection(("127.0.0.1", free), timeout=10) for _ in range(cap)]
        try:
            for sock in held:  # each is served (and stays open: keep-alive)
                sock.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", free), timeout=10) as extra:
                answer, _ = until_closed(extra)
            assert answer.startswith(b"HTTP/1.1 503") and b"connections from" in answer
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the server counts the close once it has seen it
                with socket.create_connection(("127.0.0.1", free), timeout=10) as again:
                    again.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n")
                    if again.recv(4096).startswith(b"HTTP/1.1 200"):
                        break
                assert time.monotonic() < deadline, "a closed connection was never counted out"
                time.sleep(0.05)
        finally:
            for sock in held:
                sock.close()
