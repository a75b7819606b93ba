"""An HTTP/1.1 protocol for uvicorn that refuses request heads over a limit.

Contract: `run(app, host=..., port=..., **kw)` is `uvicorn.run` with a protocol that
answers `431 Request Header Fields Too Large` and closes the connection once a request's
line and headers pass `MAX_HEAD_BYTES` (64 KiB, nginx's largest default is 32 KiB) before
they end. uvicorn's default httptools parser has no such limit: a client could make the
server buffer a 10 MB header per connection, and many of them exhaust its memory. Bodies
are not counted here; the applications limit them themselves (413). Where httptools is
not installed, uvicorn's h11 parser runs with the same limit (`h11_max_incomplete_event_size`).
uvicorn is imported only when `run` is called.

Slow and idle connections are bounded too (all before any application code or auth runs):
- a request head must be complete within `HEAD_TIMEOUT_S` (20 s) of the connection opening,
  or of the previous response ending on a keep-alive connection; otherwise the connection
  is closed (with a `408 Request Timeout` if part of a head came);
- a request body must keep coming: it is cut (408, closed) once `BODY_TIMEOUT_S` (30 s)
  plus one second per `MIN_BODY_BYTES_PER_S` (8 KiB) received since the head has passed
  and the body is still incomplete; time the application spends not reading (uvicorn has
  paused reading, or waits to send `100 Continue`) does not count against the client;
- an idle keep-alive connection is closed after `KEEP_ALIVE_S` (5 s, uvicorn's
  `timeout_keep_alive`);
- one client holds at most `MAX_PER_CLIENT` (256) open connections (503 past it): a
  client is its address, but on loopback the uid owning the connecting socket (every
  local user, each job, reaches the server from loopback, from any of 127.0.0.0/8); root
  and the server's own user are not counted on loopback and not refused by the next cap;
- past `LIMIT_CONCURRENCY` (2048) open connections or requests in flight, uvicorn answers
  new requests 503 (`limit_concurrency`; lowered to the open-files limit less
  `FD_RESERVE` where that is smaller);
- `run` raises the process's soft RLIMIT_NOFILE to its hard limit first, so sockets run
  out long after the connection limit does.
The timers exist only in the httptools protocol; under the h11 fallback the keep-alive
timeout, `limit_concurrency` and the open-files limit still apply. `HttpBounds` holds
every bound; `run(app, bounds=HttpBounds(head_timeout_s=...), ...)` changes them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 20.0
"""Seconds a request head may take, from the connection (or the last response) on."""
BODY_TIMEOUT_S = 30.0
"""Seconds of grace a request body gets, on top of its allowance by rate."""
MIN_BODY_BYTES_PER_S = 8 * 1024
"""Each byte of body received buys 1/MIN_BODY_BYTES_PER_S more seconds."""
KEEP_ALIVE_S = 5
"""Seconds an idle keep-alive connection is kept open (uvicorn's `timeout_keep_alive`)."""
LIMIT_CONCURRENCY = 2048
"""Open connections or requests in flight past which uvicorn answers 503."""
MAX_PER_CLIENT = 256
"""Open connections one client address may hold (503 and closed past it): one client
cannot take every connection the server has, nor can fewer than
LIMIT_CONCURRENCY / MAX_PER_CLIENT (8) tenants together; 0 for none."""
FD_RESERVE = 128
"""File descriptors kept free of connections: logs, the database, pipes, model files."""


@dataclass(frozen=True)
class HttpBounds:
    """The limits `run` applies (module constants by default)."""

    max_head_bytes: int = MAX_HEAD_BYTES
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    min_body_bytes_per_s: int = MIN_BODY_BYTES_PER_S
    keep_alive_s: int = KEEP_ALIVE_S
    limit_concurrency: int = LIMIT_CONCURRENCY
    max_per_client: int = MAX_PER_CLIENT


def protocol_class(
    limit: int = MAX_HEAD_BYTES,
    *,
    head_timeout_s: float = HEAD_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    min_body_bytes_per_s: int = MIN_BODY_BYTES_PER_S,
    max_per_client: int = MAX_PER_CLIENT,
    trusted_uids: frozenset[int] | None = None,
    uid_of: Callable[[str, int, tuple[str, int] | None], int | None] | None = None,
) -> type | None:
    """uvicorn's httptools protocol with the head limit, the head and body timers and the
    cap on one client's open connections; None without httptools. A client is its
    address, but on loopback (all of 127.0.0.0/8 and ::1: every local user reaches the
    server from there) it is the uid owning the connecting socket (`uid_of`, default
    `listeners.SocketOwners`: one read of the kernel's socket tables per burst of
    connections), or one
    shared "loopback, uid unknown" client when that cannot be told. Loopback connections
    of `trusted_uids` (default root and this process's user) are neither counted nor
    refused by `limit_concurrency`: other users' connections cannot lock them out."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        return None
    if uid_of is None:
        from argosy.core.listeners import SocketOwners

        uid_of = SocketOwners().uid  # one table read per burst of connections
    trusted = frozenset({0, os.geteuid()}) if trusted_uids is None else trusted_uids
    open_by_client: dict[str, int] = {}  # the listener's, shared by its connections

    def client_of(peer: Any, local: Any) -> tuple[str | None, bool]:  # noqa: ANN401
        """(the key the connection counts under, whether it is a trusted local user's)."""
        if not (isinstance(peer, tuple) and peer):
            return None, False
        if not _is_loopback(peer[0]):
            return peer[0], False
        to = (local[0], local[1]) if isinstance(local, tuple) and len(local) > 1 else None
        uid = uid_of(peer[0], peer[1], to) if len(peer) > 1 else None
        if uid is None:
            return "loopback (uid unknown)", False
        return f"loopback uid {uid}", uid in trusted

    class BoundedHeadProtocol(HttpToolsProtocol):
        """Counts the bytes fed while a request's head is incomplete, and times heads
        (from the connection or the last response on) and bodies (by rate)."""

        _head_bytes = 0
        _in_head = True
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _body_bytes = 0  # body bytes of the current request so far
        _body_clock = (0.0, 0)  # (when the allowance was last reset, _body_bytes then)

        _client: str | None = None  # the address counted for this connection

        def connection_made(self, transport: Any) -> None:  # noqa: ANN401
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            client, is_trusted = (None, False)
            if max_per_client or trusted:
                client, is_trusted = client_of(peer, transport.get_extra_info("sockname"))
            if is_trusted:
                self.limit_concurrency = None  # uvicorn's 503 past it: not for root
                client = None
            if client is not None and max_per_client:
                if open_by_client.get(client, 0) >= max_per_client:
                    self._answer_503(f"{max_per_client} connections from {client} are open")
                    transport.close()
                    return
                open_by_client[client] = open_by_client.get(client, 0) + 1
                self._client = client
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            self._cancel_body_timer()
            if self._client is not None:
                left = open_by_client.pop(self._client, 1) - 1
                if left > 0:
                    open_by_client[self._client] = left
                self._client = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > limit and not self.transport.is_closing():
                self._refuse()

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            self._cancel_head_timer()
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope and not self.transport.is_closing():
                self._body_bytes = 0  # a new request (not an upgrade): its body is timed
                self._body_clock = (self.loop.time(), 0)
                self._arm_body_timer(body_timeout_s)

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._cancel_body_timer()
            super().on_message_complete()
            self._in_head = True

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a queued request, its head already read
            super().on_response_complete()
            if self.transport.is_closing() or pipelined:
                return
            self._cancel_body_timer()  # answered early: what is left of the body counts
            self._arm_head_timer()  # as part of the wait for the next head

        # ---- timers ---------------------------------------------------------------------
        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _arm_body_timer(self, delay: float) -> None:
            self._cancel_body_timer()
            self._body_timer = self.loop.call_later(delay, self._body_check)

        def _cancel_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._head_bytes:  # part of a head came: say why the connection ends
                self._answer_408(f"request head not complete within {head_timeout_s:g} s")
            self.transport.close()

        def _body_check(self) -> None:
            """Cut the body when it falls behind its allowance: `body_timeout_s` plus a
            second per `min_body_bytes_per_s` bytes since the clock was last reset."""
            self._body_timer = None
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or not cycle.more_body:
                return
            now = self.loop.time()
            if self.flow.read_paused or cycle.waiting_for_100_continue:
                self._body_clock = (now, self._body_bytes)  # the app is not reading
                self._arm_body_timer(body_timeout_s)
                return
            since, base = self._body_clock
            allowed = body_timeout_s + (self._body_bytes - base) / min_body_bytes_per_s
            left = since + allowed - now
            if left > 0.01:
                self._arm_body_timer(left)
                return
            if not cycle.response_started:
                self._answer_408(
                    f"request body slower than {min_body_bytes_per_s} bytes/s after "
                    f"{body_timeout_s:g} s"
                )
            cycle.disconnected = True  # the app's receive() sees http.disconnect
            cycle.message_event.set()
            self.transport.close()

        def _answer_408(self, message: str) -> None:
            self._answer(b"408 Request Timeout", message)

        def _answer_503(self, message: str) -> None:
            self._answer(b"503 Service Unavailable", message)

        def _answer(self, status: bytes, message: str) -> None:
            """A plain-text answer that ends the connection, written before it closes."""
            body = f"{message}\n".encode()
            self.transport.write(
                b"HTTP/1.1 " + status + b"\r\n"
                b"content-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )

        def _refuse(self) -> None:
            body = f"request line and headers exceed {limit} bytes\n".encode()
            head = (
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            self.transport.write(head + body)
            self.transport.close()

    return BoundedHeadProtocol


def _is_loopback(host: str) -> bool:
    """Whether `host` (a peer's address) is a loopback address, IPv4-mapped ones too."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def raise_open_files_limit() -> int | None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (2**20 where the hard
    limit is unlimited); the soft limit afterwards, None where it is unlimited or the
    platform has none."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard if hard != infinity else 1 << 20, 10240):  # 10240: macOS OPEN_MAX
        if soft == infinity or (hard != infinity and target > hard) or target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    return None if soft == infinity else soft


def concurrency_limit(wanted: int, open_files: int | None) -> int:
    """`wanted`, lowered to fit in `open_files` less FD_RESERVE (at least 64)."""
    if open_files is None:
        return wanted
    return max(64, min(wanted, open_files - FD_RESERVE))


def run(app: Any, bounds: HttpBounds | None = None, **kwargs: Any) -> None:
    """`uvicorn.run(app, **kwargs)` with the request head bounded in size and time, bodies
    in rate, keep-alive and concurrency limited, and the open-files limit raised."""
    import uvicorn

    uvicorn.run(app, **(uvicorn_options(bounds) | kwargs))


def serve(
    app: Any,
    sockets: list[Any],
    bounds: HttpBounds | None = None,
    on_started: Any = None,
    **kwargs: Any,
) -> bool:
    """`run`, on listening sockets the caller bound (several addresses at once);
    `on_started()` is called once the application has started and the sockets are
    served. Whether it started (False: the application's startup failed)."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit and on_started is not None:
                on_started()

    config = uvicorn.Config(app, **(uvicorn_options(bounds) | kwargs))
    server = _Server(config)
    try:
        server.run(sockets=sockets)
    except SystemExit:  # uvicorn's exit when the application's startup fails
        return False
    return server.started


def uvicorn_options(bounds: HttpBounds | None = None) -> dict[str, Any]:
    """The uvicorn settings of `run` (the open-files limit raised on the way), for a
    server that is not started by `run` (`argosy serve` hands uvicorn its own socket)."""
    bounds = bounds or HttpBounds()
    open_files = raise_open_files_limit()
    protocol = protocol_class(
        bounds.max_head_bytes,
        head_timeout_s=bounds.head_timeout_s,
        body_timeout_s=bounds.body_timeout_s,
        min_body_bytes_per_s=bounds.min_body_bytes_per_s,
        max_per_client=bounds.max_per_client,
    )
    options: dict[str, Any] = {
        "timeout_keep_alive": bounds.keep_alive_s,
        "limit_concurrency": concurrency_limit(bounds.limit_concurrency, open_files),
    }
    if protocol is not None:
        return options | {"http": protocol}
    log.warning(
        "httptools is not installed: the HTTP listener bounds a request head's size but"
        " times neither heads nor bodies, so a client that trickles bytes holds its"
        " connection; install uvicorn[standard]"
    )
    return options | {"http": "h11", "h11_max_incomplete_event_size": bounds.max_head_bytes}
