"""An HTTP transport for the CLI that sends nothing over a connection whose server end a
stranger owns: a token goes only to root's, this user's or the argosy server's process.

A token sent to a port of this host goes to whatever process holds the port; with the
server down (or before it binds) any local user, a job, may take it. Looking at who
listens before connecting leaves a window between the look and the connect. This
transport checks the connection itself, once it is made and before a byte of the
request goes: the kernel's socket tables name the owner of the server end of this very
connection (a socket the listener accepted, or one waiting in its queue, is the
listener's owner's, also once it half-closed). A connection to this host whose server end
the tables do not name is refused too (fail closed). A connection to another host is not
checked: only its kernel knows.

    with httpx.Client(transport=owner_checked({0, os.geteuid()})) as http:
        http.get("http://127.0.0.1:8275/api/v1/jobs", headers=...)   # ArgosyError: a stranger
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from argosy.core.errors import ArgosyError
from argosy.core.listeners import CONNECTED, SocketOwners, is_this_host


class StrangerError(ArgosyError):
    """The server end of the connection belongs to a user the CLI does not trust."""


class OwnerCheckedBackend(httpcore.SyncBackend):
    """httpcore's network backend, refusing a connection whose server end a stranger owns."""

    def __init__(self, trusted: frozenset[int]) -> None:
        self.trusted = trusted

    def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        stream = super().connect_tcp(host, port, *args, **kwargs)
        sock = stream.get_extra_info("socket")
        peer, mine = sock.getpeername(), sock.getsockname()
        if not is_this_host(peer[0]):
            return stream  # another host's: only its kernel knows
        owners = SocketOwners(states=CONNECTED)  # half-closed server ends too
        uid = owners.uid(peer[0], peer[1], (mine[0], mine[1]))
        if uid is None or uid not in self.trusted:
            stream.close()
            where = f"[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"{peer[0]}:{peer[1]}"
            who = "an owner the kernel's tables do not name" if uid is None else f"uid {uid}"
            raise StrangerError(
                f"the process listening at {where} runs as {who}, neither root, this user"
                " nor the argosy server's: not the argosy server (perhaps a job that took its"
                " port); no token is sent to it"
            )
        return stream


def owner_checked(trusted: Iterable[int]) -> httpx.HTTPTransport:
    """An httpx transport (plain HTTP) whose connections are checked as above."""
    transport = httpx.HTTPTransport()
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        raise RuntimeError("this httpx keeps no httpcore pool in _pool: the check cannot apply")
    transport._pool = httpcore.ConnectionPool(  # noqa: SLF001  (httpx has no backend option)
        network_backend=OwnerCheckedBackend(frozenset(trusted))
    )
    return transport
