"""`--token-file PATH` keeps a token off the command line; `--token` still works but
warns that command lines are visible to every user of the host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from argosy.cli.client import TOKEN_WARNING, read_token_file
from argosy.core.errors import ArgosyError


def _recording_server() -> tuple[socket.socket, list[bytes]]:
    """A one-shot HTTP server on 127.0.0.1 that answers an empty jobs page and keeps
    what it was sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(conn.recv(65536))
            body = b'{"items": [], "next_cursor": null}'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + body
            )

    threading.Thread(target=serve, daemon=True).start()
    return listener, seen


def _jobs(*args: str, command: str = "jobs") -> tuple[subprocess.CompletedProcess, list[bytes]]:
    listener, seen = _recording_server()
    with listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARGOSY_TOKEN")}
        env |= {"PYTHONPATH": os.getcwd(), "ARGOSY_HOME": "/nonexistent-argosy-home"}
        r = subprocess.run(
            [sys.executable, "-m", "argosy", command, "--server", url, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    return r, seen


def test_token_file_sends_the_files_token_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("argosy_from_file\n")
    r, seen = _jobs("--token-file", str(path))
    assert r.returncode == 0, r.stderr
    assert b"Bearer argosy_from_file" in seen[0]
    assert "warning" not in r.stderr


def test_token_on_the_command_line_works_and_warns() -> None:
    r, seen = _jobs("--token", "argosy_on_cmdline")
    assert r.returncode == 0, r.stderr
    assert b"Bearer argosy_on_cmdline" in seen[0]
    assert TOKEN_WARNING in r.stderr


def test_a_missing_or_empty_token_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ArgosyError, match="cannot read the token file"):
        read_token_file(tmp_path / "absent")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ArgosyError, match="is empty"):
        read_token_file(tmp_path / "empty")


def test_a_token_file_given_after_the_command_name_is_read_as_a_file(tmp_path: Path) -> None:
    """Every job command takes --token-file itself: `argosy services --token-file P`
    sends the file's token, not the path."""
    path = tmp_path / "token"
    path.write_text("argosy_services_file\n")
    r, seen = _jobs("--token-file", str(path), command="services")
    assert b"Bearer argosy_services_file" in seen[0], (r.stderr, seen)
    assert str(path).encode() not in seen[0]
