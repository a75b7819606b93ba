"""The trainer's end of its persister: start, connection, messages in and out.

`FlashCheckpointer` (flash.py) is a `PersisterLink`: this part starts the persister
(launch.py), pumps its messages (`_pump`, `_receive`, `_drain`) into the checkpointer's
state (`_handle`), sends (`_send`), reports progress to the runtime's hang detector
(`_report`), and turns a broken connection into a `CheckpointError` naming the exit code
and the persister's log. The state it uses is declared on the class and made by the
checkpointer's `__init__`. The messages are listed in persister.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.checkpoint.launch import PersisterHandle, cpu_ticks, start_persister
from argosy.core.errors import ArgosyError


class CheckpointError(ArgosyError):
    """The persister failed (disk full, unwritable directory, died); earlier steps are intact."""


class PersisterLink:
    """The persister side of `FlashCheckpointer` (see the module docstring)."""

    directory: Path
    hang_timeout_s: float | None
    last_copy_s: float | None
    last_copy_end: float | None
    last_write: tuple[float, float, float] | None
    _spec: Any  # persister.PersisterSpec
    _progress: Callable[[str, int], None] | None
    _launch: PersisterHandle | None
    _proc: Any
    _conn: Any
    _ready: bool
    _sources_taken: bool
    _pending: int | None
    _durable: int
    _flushed: tuple[int, str | None] | None
    _errors: list[str]
    _closed: bool
    _start_ticks: int | None

    def _start(self) -> None:
        """Start the persister (launch.py); it connects back while the caller goes on."""
        self._launch = start_persister(self._spec, self.directory / ".logs")
        self._proc = self._launch.proc

    def _connected(self) -> bool:
        if self._conn is not None:
            return True
        if self._launch.poll_connected():
            self._conn = self._launch.conn
            return True
        if self._proc.poll() is not None:
            raise CheckpointError(
                f"the checkpoint persister exited with code {self._proc.returncode}"
                f" (its log: {self.directory / '.logs'})"
            )
        return False

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            self._ready = True
        elif kind == "sources_taken":
            self._sources_taken = True
        elif kind == "copied":
            self.last_copy_s, self.last_copy_end = msg[2], msg[3]
            if self._pending == msg[1]:
                self._pending = None
            self._report("copied", 0)
        elif kind == "progress":
            self._report(msg[1], msg[2])
        elif kind == "durable":
            self._committed(msg[1])
            self.last_write = msg[2] or self.last_write
        elif kind == "flushed":
            self._committed(msg[1])
            self._flushed = (msg[1], msg[2])
        elif kind == "error":
            self._errors.append(msg[1])
        elif kind == "closed":
            self._closed = True

    def _committed(self, step: int) -> None:
        if step > self._durable:
            self._durable = step
            self._report("committed", step)

    def _report_start(self) -> None:
        """While the persister starts, its CPU time is the progress (a stuck start shows
        none, so the watchdog catches it like any other hang)."""
        ticks = cpu_ticks(self._proc.pid) if self._proc is not None else None
        if ticks is not None and ticks != self._start_ticks:
            self._start_ticks = ticks
            self._report("start", ticks)

    def _report(self, phase: str, done_bytes: int) -> None:
        if self._progress is not None:
            self._progress(phase, done_bytes)

    def _pump(self, until: Any, timeout_s: float | None = None) -> None:
        """Handle persister messages until `until()` holds; raise if the persister died."""
        import time

        timeout_s = self.hang_timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not until():
            if not self._ready:
                self._report_start()
            if not self._connected():
                if deadline is not None and time.monotonic() > deadline:
                    raise CheckpointError(
                        f"the checkpoint persister did not start in {timeout_s} s"
                    )
                continue
            if self._receive(0.05):
                continue
            if self._proc.poll() is not None and not self._conn.poll():
                raise CheckpointError(
                    f"the checkpoint persister exited with code {self._proc.returncode}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise CheckpointError(f"the checkpoint persister did not answer in {timeout_s} s")

    def _receive(self, wait_s: float = 0.0) -> bool:
        """Handle one message if one comes within `wait_s`; CheckpointError when the
        connection broke (EOF, or a reset when the persister was killed mid-message)."""
        try:
            if not self._conn.poll(wait_s):
                return False
            self._handle(self._conn.recv())
        except (EOFError, OSError) as err:
            raise self._gone(err) from err
        return True

    def _send(self, msg: tuple) -> None:
        """Send one message; CheckpointError when the persister is gone (a broken pipe)."""
        try:
            self._conn.send(msg)
        except OSError as err:
            raise self._gone(err) from err

    def _gone(self, err: BaseException) -> CheckpointError:
        """The error for a connection that broke: the persister died (its exit code)."""
        code = self._proc.poll() if self._proc is not None else None
        return CheckpointError(
            f"the checkpoint persister exited unexpectedly (exit code {code}, "
            f"{type(err).__name__}; its log: {self.directory / '.logs'})"
        )

    def _drain(self) -> None:
        while self._conn is not None and self._receive():
            pass

    def _raise_errors(self) -> None:
        self._drain()
        if self._errors:
            errors, self._errors = self._errors, []
            raise CheckpointError("; ".join(errors))
