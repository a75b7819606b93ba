"""The HTTP listener's bounds come from the server's config (`http:` in `--config`): a
head that never completes is cut after `head_timeout_s` (20 s by default), and a bound
that is not one is refused at start naming its line."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_helpers import ServerProcess

from argosy.server.config import HttpLimits, ServerConfig

pytestmark = pytest.mark.integration


def test_a_configured_head_timeout_cuts_a_silent_client(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("http:\n  head_timeout_s: 1.0\n")
    server = ServerProcess(tmp_path / "home", "--config", str(config))
    server.start()
    try:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")  # never finished
            start = time.monotonic()
            with contextlib.suppress(ConnectionResetError):  # a reset is a close too
                while sock.recv(4096):  # a 408 or nothing, then the close
                    pass
            waited = time.monotonic() - start
        assert waited < 10.0, waited  # 1 s and slack on a loaded machine, not the default 20
    finally:
        server.kill()


def test_a_bound_that_is_not_one_is_refused_naming_its_line(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("port: 0\nhttp:\n  keep_alive_s: 5\n  limit_concurrency: 0\n")
    cmd = [sys.executable, "-m", "argosy", "server", "--home", str(tmp_path / "home")]
    done = subprocess.run([*cmd, "--config", str(config)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "server.yaml:4 field 'http.limit_concurrency'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_defaults_are_the_listener_s_own() -> None:
    from argosy.core.bounded_http import HttpBounds

    assert ServerConfig().http.bounds() == HttpBounds()
    with pytest.raises(ValueError, match="extra"):
        HttpLimits.model_validate({"head_timeout": 3})
