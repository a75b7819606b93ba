"""An HTTP/1.1 protocol for uvicorn that refuses request heads over a limit.

Contract: `run(app, host=..., port=..., **kw)` is `uvicorn.run` with a protocol that
answers `431 Request Header Fields Too Large` and closes the connection once a request's
line and headers pass `MAX_HEAD_BYTES` (64 KiB, nginx's largest default is 32 KiB) before
they end. uvicorn's default httptools parser has no such limit: a client could make the
server buffer a 10 MB header per connection, and many of them exhaust its memory. Bodies
are not counted here; the applications limit them themselves (413). Where httptools is
not installed, uvicorn's h11 parser runs with the same limit (`h11_max_incomplete_event_size`).
uvicorn is imported only when `run` is called.
"""

from __future__ import annotations

from typing import Any

MAX_HEAD_BYTES = 64 * 1024


def protocol_class(limit: int = MAX_HEAD_BYTES) -> type | None:
    """uvicorn's httptools protocol with the head limit; None without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        return None

    class BoundedHeadProtocol(HttpToolsProtocol):
        """Counts the bytes fed while a request's head is incomplete."""

        _head_bytes = 0
        _in_head = True

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > limit and not self.transport.is_closing():
                self._refuse()

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head = True

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


def run(app: Any, **kwargs: Any) -> None:
    """`uvicorn.run(app, **kwargs)` with the request head bounded."""
    import uvicorn

    protocol = protocol_class()
    if protocol is not None:
        kwargs.setdefault("http", protocol)
    else:
        kwargs.setdefault("http", "h11")
        kwargs.setdefault("h11_max_incomplete_event_size", MAX_HEAD_BYTES)
    uvicorn.run(app, **kwargs)
