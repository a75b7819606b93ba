"""The access log: one line per HTTP request, written by a pure ASGI middleware.

    2025-06-01T12:00:00.123Z GET /api/v1/jobs?state&limit 200 1.4ms "token t1a2b3c4d5e6 (ci)"

Fields: UTC time, method, path (query parameter names only: their values may carry
secrets), status, duration in milliseconds, actor. The actor is what the authentication
dependency put in `scope["state"]["actor"]` (`request.state.actor`): `admin`,
`token <id> (<name>)`; `-` when no token was accepted. The file is `<home>/logs/access.log`
(0600 in a 0700 directory), rotated at `access_log_max_bytes` with `access_log_backups`
older files kept (`access.log.1`, ...).

    app.add_middleware(AccessLog, home=config.home, max_bytes=10 << 20, backups=3)

The middleware knows nothing of tokens or routes; it only reads the state key.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import time
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACTOR_KEY = "actor"
"""Key in `scope["state"]` (`request.state.actor`) that names who made the request."""
NO_ACTOR = "-"
LOGGER = "argosy.access"
MAX_PATH_CHARS = 512


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating file handler whose files are created 0600, whatever the umask, and
    that counts the bytes it wrote instead of asking the file (`tell()` on a text file
    was a third of a line's cost)."""

    def _open(self) -> Any:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = os.open(self.baseFilename, flags, 0o600)
        os.fchmod(fd, 0o600)  # a file left by an older server may be wider
        self.size_bytes = os.fstat(fd).st_size
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

    def shouldRollover(self, record: logging.LogRecord) -> bool:  # noqa: N802 (logging's name)
        if self.stream is None:
            self.stream = self._open()
        return self.size_bytes > 0 and self.size_bytes + _line_bytes(record) > self.maxBytes

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.size_bytes += _line_bytes(record)


def _line_bytes(record: logging.LogRecord) -> int:
    return len(str(record.msg).encode()) + 1


def open_access_log(home: Path, max_bytes: int, backups: int) -> PrivateRotatingFileHandler:
    """The handler of `<home>/logs/access.log` (0600 in a 0700 directory)."""
    directory = home / "logs"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    handler = PrivateRotatingFileHandler(
        directory / "access.log", maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


class AccessLog:
    """Pure ASGI middleware: times each HTTP request and logs one line when it ends."""

    def __init__(self, app: ASGIApp, *, home: Path, max_bytes: int, backups: int) -> None:
        self.app = app
        self.handler = open_access_log(home, max_bytes, backups)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        method, path = scope["method"], request_path(scope)  # before routing touches scope
        state = scope.setdefault("state", {})  # shared with request.state downstream
        status = 500  # what the server answers when the app raises

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            ms = (time.perf_counter() - start) * 1000
            actor = state.get(ACTOR_KEY) or NO_ACTOR
            line = access_line(method, path, status, ms, actor)
            # to the handler itself: a Logger would look up its caller's frame (findCaller)
            self.handler.handle(logging.LogRecord(LOGGER, logging.INFO, "", 0, line, None, None))

    def _closing(self, send: Send) -> Send:
        """The lifespan's `send`, closing the log file once the app has shut down."""

        async def send_and_close(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.shutdown.complete":
                self.handler.close()

        return send_and_close


def access_line(method: str, path: str, status: int, ms: float, actor: str) -> str:
    """One line of the log, stamped now (UTC, milliseconds)."""
    when = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
    millis = int(when % 1 * 1000)
    return f'{stamp}.{millis:03d}Z {_clean(method)} {path} {status} {ms:.1f}ms "{_clean(actor)}"'


def request_path(scope: Scope) -> str:
    """The path as it came (percent-encoded) with the query's parameter names only."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope.get("path", "")
    query = scope.get("query_string", b"")
    if query:
        names = (p.split(b"=", 1)[0].decode("latin-1") for p in query.split(b"&") if p)
        path += "?" + "&".join(names)
    return _clean(path[:MAX_PATH_CHARS]).replace(" ", "%20")


def _clean(text: str) -> str:
    """`text` on one line: control characters, spaces in paths, quotes and backslashes
    escaped, so a request cannot forge a line or a field."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c not in '"\\' else f"\\x{ord(c):02x}" for c in text)
