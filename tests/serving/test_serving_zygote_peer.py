"""The zygote serves one user: its socket is 0600 in a 0700 directory of the user's own, it
refuses a connection from another uid before reading anything (the peer's credentials are
injected: the test cannot run as two users), a silent client cannot stall it, and a
service hands its pipe only to a zygote of its own uid. No worker is forked here: `fork`
is replaced, so a request that gets through is answered "fork failed"."""

import gc
import os
import signal
import socket
import stat
import threading

import pytest

from argosy.core.errors import ArgosyError
from argosy.serving import zygote
from argosy.serving.zygote import ZygoteServer, ZygoteUnavailableError, fork_worker

ME = os.geteuid()


def _as(uid):
    return lambda sock: (4242, uid, 0)


def _unused_target(conn, config):
    raise AssertionError("no worker runs in these tests")


@pytest.fixture
def forks(monkeypatch):
    """Every fork the zygote tries; none happens."""
    tried = []

    def no_fork():
        tried.append(1)
        raise OSError("no fork in this test")

    monkeypatch.setattr(zygote.os, "fork", no_fork)
    return tried


@pytest.fixture
def serve(tmp_path, forks):
    """Start a zygote (no preloads) with a given client uid, serving on a thread."""
    servers = []
    before = signal.getsignal(signal.SIGCHLD)

    def start(client_uid=ME, recv_timeout_s=5.0):
        path = tmp_path / "run" / "zygote.sock"
        server = ZygoteServer(
            path,
            _unused_target,
            preload=(),
            recv_timeout_s=recv_timeout_s,
            peer_credentials=_as(client_uid),
        )
        server.start()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return path

    yield start
    for server, thread in servers:
        server.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
    signal.signal(signal.SIGCHLD, before)  # start() ignores it for the zygote's children
    gc.unfreeze()  # and freezes the collector's objects


def _ask(path, **kwargs):
    left, right = socket.socketpair()
    with left, right:
        return fork_worker(path, right.fileno(), {"engine": "transformers"}, **kwargs)


def test_the_socket_is_0600_in_a_0700_directory(serve):
    path = serve()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700
    assert os.lstat(path.parent).st_uid == ME


def test_a_connection_from_another_uid_is_refused_before_anything_is_read(serve, forks):
    path = serve(client_uid=ME + 1)
    with pytest.raises(ZygoteUnavailableError, match=rf"runs as uid {ME + 1}.*refused"):
        _ask(path)
    assert forks == []


def test_a_connection_of_this_user_gets_through(serve, forks):
    path = serve(client_uid=ME)
    with pytest.raises(ZygoteUnavailableError, match="fork failed"):
        _ask(path)
    assert forks == [1]


def test_a_silent_client_does_not_stall_the_zygote(serve, forks):
    path = serve(recv_timeout_s=0.3)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(path))  # connects, then never sends
        with pytest.raises(ZygoteUnavailableError, match="fork failed"):
            _ask(path, timeout_s=5.0)  # answered once the silent one timed out
    assert forks == [1]


def test_a_service_hands_its_pipe_only_to_a_zygote_of_its_own_uid(serve, forks):
    path = serve()
    with pytest.raises(ZygoteUnavailableError, match=r"zygote \(pid \d+\) runs as uid"):
        _ask(path, peer_credentials=_as(ME + 1))
    assert forks == []


def test_the_socket_directory_must_be_the_users_own(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    os.chmod(real, 0o755)
    zygote.own_socket_directory(real)  # this user's: closed to others
    assert stat.S_IMODE(os.lstat(real).st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ArgosyError, match="not a directory"):
        zygote.own_socket_directory(link)
    server = ZygoteServer(link / "z.sock", _unused_target, preload=())
    with pytest.raises(ArgosyError, match="--socket"):
        server.start()
    server.stop()  # never bound: removes nothing
