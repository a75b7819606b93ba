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

One user only: whoever can hand the zygote a config and a descriptor runs code as the
zygote's user (the worker unpickles what arrives on it), and a service hands its pipe to
whatever answers on the socket. So the socket lives in a directory of the user's own, mode
0700 (made so, or refused), the socket itself is 0600, and both ends check the other's
uid with `SO_PEERCRED` before anything is read or sent: the zygote refuses a connection
from another uid, `fork_worker` a zygote of another uid. A client has `recv_timeout_s`
(5 s) to send its request, so a silent one cannot stall the zygote.

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
import stat
import struct
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.core.own_files import own_directory
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
PeerCredentials = Callable[[socket.socket], tuple[int, int, int]]
"""(pid, uid, gid) of the process at the other end of a connected Unix socket."""


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
        recv_timeout_s: float = 5.0,
        peer_credentials: PeerCredentials | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.target = target
        self.preload = tuple(preload)
        self.warm_models = tuple(warm_models)
        self.recv_timeout_s = recv_timeout_s
        """Seconds a client has to send its whole request (and to take the answer)."""
        self.peer_credentials = peer_credentials or read_peer_credentials
        self._listener: socket.socket | None = None
        self._stopping = False

    def start(self) -> None:
        """Import the preloaded modules and bind the socket (ready for `serve_forever`) in a
        directory of this user's own (made 0700, or checked); `ArgosyError` if it is not."""
        started = time.perf_counter()
        own_socket_directory(self.socket_path.parent)  # before the slow imports
        for name in self.preload:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as err:  # another transformers version: workers import it
                log.info("zygote: not preloading %s: %s", name, err)
        self._warm_tokenizers()
        gc.collect()
        gc.freeze()  # the collector leaves inherited objects alone (no copy-on-write), here
        # and in the forked workers, which keep them frozen: they are modules, never garbage
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a socket left by a zygote that died
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)  # the directory (0700) kept others out meanwhile
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
                self._serve_one(client)

    def stop(self) -> None:
        """Stop accepting and remove the socket; forked workers go on serving."""
        self._stopping = True
        if self._listener is None:
            return  # never bound: the name is not this zygote's to remove
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() in another thread
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _serve_one(self, client: socket.socket) -> None:
        """One connection: only from a process of this user, read within `recv_timeout_s`."""
        client.settimeout(self.recv_timeout_s)
        refusal = refusal_of_peer(client, self.peer_credentials, "the client")
        if refusal is not None:
            log.warning("zygote: %s", refusal)
            _reply(client, {"error": refusal})
            return
        self._handle(client)

    def _handle(self, client: socket.socket) -> None:
        try:
            data, fds = _receive(client, self.recv_timeout_s)
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
    """`$ARGOSY_ZYGOTE_SOCKET`, else `zygote/zygote.sock` in argosy's cache directory (a
    folder of its own, which the zygote makes 0700: the cache itself keeps its mode)."""
    from argosy.serving.models import cache_root

    env = os.environ.get("ARGOSY_ZYGOTE_SOCKET")
    return Path(env) if env else cache_root(None) / "zygote" / "zygote.sock"


def fork_worker(
    socket_path: Path,
    worker_fd: int,
    config: dict[str, Any],
    timeout_s: float = 30.0,
    peer_credentials: PeerCredentials | None = None,
) -> tuple[int, int]:
    """Ask the zygote at `socket_path` to fork a worker on `worker_fd`: (pid, zygote pid).
    The pipe goes only to a zygote of this user: what answers on the socket gets it, and
    the service unpickles what comes back on it."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(socket_path))
            read = peer_credentials or read_peer_credentials
            refusal = refusal_of_peer(sock, read, "the zygote")
            if refusal is not None:
                raise ZygoteUnavailableError(f"zygote on {socket_path}: {refusal}")
            payload = json.dumps({"config": config}).encode() + b"\n"
            fds = array.array("i", [worker_fd])
            # refused before it read us (the pipe is broken): its answer is still there
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
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


def read_peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, as the kernel
    recorded them at connect (`SO_PEERCRED`, Linux); `OSError` where there is no such option."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        raise OSError("SO_PEERCRED is not available on this platform")
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, size))
    return pid, uid, gid


def refusal_of_peer(sock: socket.socket, read: PeerCredentials, who: str) -> str | None:
    """Why the process at the other end of `sock` is refused; None when it runs as this
    (effective) user. Unknown credentials are refused too."""
    try:
        pid, uid, _ = read(sock)
    except OSError as err:
        return f"cannot tell which user {who} runs as ({err}): refused"
    if uid != os.geteuid():
        return f"{who} (pid {pid}) runs as uid {uid}, not this user ({os.geteuid()}): refused"
    return None


def own_socket_directory(directory: Path) -> None:
    """Make `directory` (0700), or check that it is this user's own directory, not a
    link, and close it to others (`own_files.own_directory`); `ArgosyError` naming the
    fix otherwise: in a directory others may enter they could connect, or put their own
    socket in the zygote's place."""
    held = own_directory(directory)
    if held is None:
        return
    what = "not a directory (a link?)" if not stat.S_ISDIR(held.st_mode) else "another user's"
    raise ArgosyError(
        f"zygote socket directory {directory} is {what} (uid {held.st_uid}; this user "
        f"{os.geteuid()}): put the socket in a directory of your own (--socket, or "
        "$ARGOSY_ZYGOTE_SOCKET)"
    )


def _parse(data: bytes) -> dict[str, Any]:
    try:
        request = json.loads(data)
    except ValueError:
        return {}
    return request if isinstance(request, dict) else {}


def _receive(client: socket.socket, timeout_s: float) -> tuple[bytes, list[int]]:
    """One request line and the descriptors sent with it, all within `timeout_s` (a client
    that trickles bytes cannot hold the zygote either); `OSError` (`TimeoutError`) else,
    with any descriptor received closed."""
    deadline = time.monotonic() + timeout_s
    fds = array.array("i")
    client.settimeout(timeout_s)
    data, ancillary, _, _ = client.recvmsg(_MAX_MESSAGE_BYTES, socket.CMSG_SPACE(4 * 4))
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    try:
        while not data.endswith(b"\n") and len(data) < _MAX_MESSAGE_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole request within {timeout_s:g} s")
            client.settimeout(left)
            more = client.recv(_MAX_MESSAGE_BYTES - len(data))
            if not more:
                break
            data += more
    except OSError:
        _close_all(list(fds))
        raise
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
