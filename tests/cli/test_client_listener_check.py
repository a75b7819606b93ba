"""The CLI sends no token to a port of this host held by a stranger (a job that took
the server's port), and says which port and uid: checked on the connection itself, so a
port taken between a look at the listeners and the connect is caught too."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from argosy.cli import client as client_mod
from argosy.cli.client import Client
from argosy.core.errors import ArgosyError

NOBODY = 65534


def _stranger(half_close: bool) -> Iterator[int]:
    """A port of 127.0.0.1 that a process of uid 65534 listens on (root only); with
    `half_close` it shuts its writing down on each connection at once (its socket then
    leaves ESTABLISHED) and reads on. Fails the test if any token reached it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another uid")
    code = (
        "import os,socket,sys,time\n"
        f"os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c,_=s.accept()\n"
        f"    if {half_close}: c.shutdown(socket.SHUT_WR)\n"
        "    c.settimeout(2)\n"
        "    try: sys.stderr.write(repr(c.recv(4096))); sys.stderr.flush()\n"
        "    except OSError: pass\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        _, received = proc.communicate()  # what it read before the connections closed
    assert "secret" not in received, received


@pytest.fixture
def stranger_port() -> Iterator[int]:
    yield from _stranger(half_close=False)


@pytest.fixture
def half_closing_port() -> Iterator[int]:
    yield from _stranger(half_close=True)


def test_no_token_goes_to_a_strangers_listener(stranger_port: int) -> None:
    client = Client(f"http://127.0.0.1:{stranger_port}", "argosy_secret")
    with pytest.raises(ArgosyError) as err:
        client.call("GET", "/jobs")
    assert f"127.0.0.1:{stranger_port}" in str(err.value)
    assert f"uid {NOBODY}" in str(err.value)


def test_the_cli_exits_2_naming_port_and_uid(stranger_port: int) -> None:
    env = os.environ | {"ARGOSY_TOKEN": "argosy_secret", "PYTHONPATH": os.getcwd()}
    r = subprocess.run(
        [sys.executable, "-m", "argosy", "jobs", "--server", f"http://127.0.0.1:{stranger_port}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert f"uid {NOBODY}" in r.stderr and str(stranger_port) in r.stderr
    assert "Traceback" not in r.stderr


def test_the_connection_itself_is_checked_not_a_look_before_it(
    stranger_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port looked free when a check before the connect looked (nobody listened),
    then a job took it: the connection's own server end is its."""
    import argosy.core.listeners as listeners

    monkeypatch.setattr(listeners, "listener_uids", lambda *a, **k: set())
    with pytest.raises(ArgosyError, match=f"uid {NOBODY}"):
        Client(f"http://127.0.0.1:{stranger_port}", "argosy_secret").call("GET", "/jobs")


@pytest.mark.parametrize("scheme", ["http", "HTTP", "Http"])
def test_a_half_closing_stranger_gets_no_token_whatever_the_schemes_case(
    half_closing_port: int, scheme: str
) -> None:
    """Its server end is FIN_WAIT, not ESTABLISHED: still named, still refused; and the
    scheme's case does not skip the check."""
    for _ in range(5):
        client = Client(f"{scheme}://127.0.0.1:{half_closing_port}", "argosy_secret")
        with pytest.raises(ArgosyError, match=f"uid {NOBODY}|do not name"):
            client.call("GET", "/jobs")


def test_a_server_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(ArgosyError, match="bad server URL"):
        Client("ftp://127.0.0.1:1", "argosy_secret").call("GET", "/jobs")


def test_root_this_user_and_the_admin_token_owner_are_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_mod, "_admin_token_owner", lambda: {4242})
    assert client_mod.trusted_uids() == {0, os.geteuid(), 4242}


def test_a_connection_to_a_trusted_owner_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener of this process's user: the request goes through (the server's 404)."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{server.server_address[1]}", "argosy_secret")
        with pytest.raises(ArgosyError, match="^501"):  # answered: no handler for GET
            client.call("GET", "/jobs")
    finally:
        server.shutdown()
