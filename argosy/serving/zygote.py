"""A node zygote: one process per node that has imported torch and transformers once and
forks serving workers on request, so that a service's worker starts in a fraction of a second.

Why: a fresh Python that imports torch and transformers takes 7-10 s on two idle cores (80+ s
under heavy load) and holds ~250 MiB of anonymous memory before it loads any model. A worker
forked from the zygote inherits those imports copy-on-write, so a service can end its worker
at sleep (giving back everything the worker held) and still wake quickly. The zygote holds
no model, no device context and no request; every service on the node shares it.

Protocol (a Unix socket, one connection per worker): the client sends one JSON line
`{"config": {...}}` with the worker's end of a socket pair attached (SCM_RIGHTS); the zygote
forks, the child runs `target(Connection(fd), config)` in a new session and exits; the zygote
answers `{"pid": N, "zygote_pid": M}`. The zygote reaps its children; a worker ends itself
when its service closes the pipe, whether or not the zygote still runs.

    server = ZygoteServer(Path("/run/argosy/zygote.sock"), target=worker_main)
    server.serve_forever()                                    # in `argosy zygote`
    pid, zygote_pid = fork_worker(path, child_conn.fileno(), config)   # in the service
"""

from __future__ import annotations

import array
import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.core.procs import pid_alive, start_ticks

log = logging.getLogger(__name__)

DEFAULT_PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
    "transformers.convert_slow_tokenizer",
    "tokenizers",
    "jinja2",
    "argosy.serving.transformers_engine",
    "argosy.serving.speculative",
)
_MAX_MESSAGE_BYTES = 1 << 20

WorkerTarget = Callable[[Connection, dict[str, Any]], None]


class ZygoteUnavailableError(ArgosyError):
    """No zygote answers on the socket (not started, stopped, or not ours)."""


class ZygoteServer:
    """Preloads modules, then forks a worker per request on a Unix socket."""

    def __init__(
        self,
        socket_path: Path,
        target: WorkerTarget,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        warm_models: Sequence[str] = (),
    ) -> None:
        self.socket_path = socket_path
        self.target = target
        self.preload = tuple(preload)
        self.warm_models = tuple(warm_models)
        self._listener: socket.socket | None = None
        self._stopping = False

    def start(self) -> None:
        """Import the preloaded modules and bind the socket (ready for `serve_forever`)."""
        started = time.perf_counter()
        for name in self.preload:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as err:  # another transformers version: workers import it
                log.info("zygote: not preloading %s: %s", name, err)
        self._warm_tokenizers()
        gc.collect()
        gc.freeze()  # the collector leaves inherited objects alone (no copy-on-write), here
        # and in the forked workers, which keep them frozen: they are modules, never garbage
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a socket left by a zygote that died
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(64)
        self._listener = listener
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps forked workers
        log.info("zygote ready on %s in %.1f s", self.socket_path, time.perf_counter() - started)

    def _warm_tokenizers(self) -> None:
        """Load the named models' tokenizers (small; no weights) for the workers to inherit."""
        if not self.warm_models:
            return
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no thread pool across fork
        from argosy.serving.models import resolve
        from argosy.serving.transformers_engine import load_tokenizer

        for name in self.warm_models:
            load_tokenizer(resolve(name, None))
            log.info("zygote: tokenizer of %s loaded", name)

    def serve_forever(self) -> None:
        """Fork a worker per connection until `stop` (or SIGTERM)."""
        if self._listener is None:
            self.start()
        assert self._listener is not None
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                break  # the listener was closed by stop()
            with client:
                self._handle(client)

    def stop(self) -> None:
        """Stop accepting and remove the socket; forked workers go on serving."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _handle(self, client: socket.socket) -> None:
        try:
            data, fds = _receive(client)
        except OSError as err:
            log.warning("zygote: unreadable request: %s", err)
            return
        request = _parse(data)
        if len(fds) != 1 or not isinstance(request.get("config"), dict):
            _close_all(fds)
            _reply(client, {"error": "want one file descriptor and a 'config' object"})
            return
        try:
            pid = os.fork()
        except OSError as err:  # out of processes or memory: the service falls back to spawn
            os.close(fds[0])
            _reply(client, {"error": f"fork failed: {err}"})
            return
        if pid == 0:
            self._run_child(client, fds[0], request["config"])
        os.close(fds[0])
        _reply(client, {"pid": pid, "zygote_pid": os.getpid()})

    def _run_child(self, client: socket.socket, fd: int, config: dict[str, Any]) -> None:
        """In the forked child: leave the zygote's socket, session and signals, run target."""
        code = 0
        try:
            client.close()
            if self._listener is not None:
                self._listener.close()
            os.setsid()  # a Ctrl-C at the zygote's terminal does not reach the workers
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            self.target(Connection(fd), config)
        except BaseException:  # the child must never return into the zygote's loop
            log.exception("zygote worker failed")
            code = 1
        finally:
            os._exit(code)


def default_socket_path() -> Path:
    """`$ARGOSY_ZYGOTE_SOCKET`, else `zygote.sock` in argosy's cache directory."""
    from argosy.serving.models import cache_root

    env = os.environ.get("ARGOSY_ZYGOTE_SOCKET")
    return Path(env) if env else cache_root(None) / "zygote.sock"


def fork_worker(
    socket_path: Path, worker_fd: int, config: dict[str, Any], timeout_s: float = 30.0
) -> tuple[int, int]:
    """Ask the zygote at `socket_path` to fork a worker on `worker_fd`: (pid, zygote pid)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(socket_path))
            payload = json.dumps({"config": config}).encode() + b"\n"
            sock.sendmsg(
                [payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [worker_fd]))]
            )
            answer = json.loads(_read_line(sock))
    except (OSError, ValueError) as err:
        raise ZygoteUnavailableError(f"no zygote answers on {socket_path}: {err}") from err
    if "pid" not in answer:
        raise ZygoteUnavailableError(f"zygote on {socket_path} refused: {answer.get('error')}")
    return int(answer["pid"]), int(answer["zygote_pid"])


class ForkedWorker:
    """A worker the zygote forked: the service is not its parent, so it polls by pid. The
    zygote reaps it, and pids wrap: its start time tells it from a later process that
    reuses the number, which is never signalled."""

    def __init__(self, pid: int, zygote_pid: int) -> None:
        self.pid = pid
        self.zygote_pid = zygote_pid
        self._started = start_ticks(pid)

    def is_alive(self) -> bool:
        """True while this process exists (not a zombie, not a stranger with its pid)."""
        return self._started >= 0 and start_ticks(self.pid) == self._started and pid_alive(self.pid)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process has exited, at most `timeout` seconds."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL the worker, if it still runs."""
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _parse(data: bytes) -> dict[str, Any]:
    try:
        request = json.loads(data)
    except ValueError:
        return {}
    return request if isinstance(request, dict) else {}


def _receive(client: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = client.recvmsg(_MAX_MESSAGE_BYTES, socket.CMSG_SPACE(4 * 4))
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    while not data.endswith(b"\n") and len(data) < _MAX_MESSAGE_BYTES:
        more = client.recv(_MAX_MESSAGE_BYTES)
        if not more:
            break
        data += more
    return data, list(fds)


def _reply(client: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        client.sendall(json.dumps(answer).encode() + b"\n")


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        more = sock.recv(4096)
        if not more:
            break
        data += more
    return data


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
