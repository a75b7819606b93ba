"""Ports: `free_port()` is a TCP port on 127.0.0.1 that nothing listens on now (the
kernel's pick; another process may take it before the caller binds it); `DEFAULT_PORT`
is where `argosy server` listens unless told otherwise."""

from __future__ import annotations

import socket

DEFAULT_PORT = 8275
"""`argosy server`'s port: clear of Ray's defaults (dashboard 8265, GCS 6379, client
10001, dashboard agent 52365, metrics 8080), so both run on one head node."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
