"""Where the Ray cluster is, checked before `ray.init` (which waits a minute or more on an
address where nothing answers, and then fails with a gRPC timeout).

`resolve(address)` turns `auto` into what Ray itself would use (`$RAY_ADDRESS`, else the
address of the cluster last started on this host, `/tmp/ray/ray_current_cluster`);
`check_reachable(address)` opens a TCP connection to the head's GCS port within
`timeout_s` and raises `ArgosyError` (the CLI exits 2) naming the address and the fix
when nothing answers, or when a port of this host is held by a user other than root or
this process's (`refuse_foreign_listener`: a job that bound the port of a head that is
down would be sent the server's Ray token). No Ray import.

    check_reachable("127.0.0.1:6379")          # returns the resolved "host:port"

`asks_for_token(address)` asks the cluster itself, with one GCS call that carries no
token, whether it lets clients in without Ray's token (Ray >= 2.52, `RAY_AUTH_MODE=token`):
a cluster that answers it rather than refusing with UNAUTHENTICATED lets anything that
reaches the head's ports, a job on any node included, submit work that runs as Ray's own
user. This process's own client mode says nothing about that (a client in token mode
connects to an open cluster too); `refuse_open_cluster` stops a server whose jobs are
meant to run as other users on such a cluster.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from argosy.core.errors import ArgosyError
from argosy.core.listeners import listener_uids

CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")
"""Where `ray start --head` records the address of the cluster it started."""
DEFAULT_GCS_PORT = 6379
FIX = "start one with `ray start --head` or pass --ray-address HOST:PORT of a running head"


def resolve(address: str | None) -> str:
    """`host:port` for `address` (`auto`/empty: Ray's own lookup), else `ArgosyError`."""
    address = (address or "auto").strip()
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "").strip() or _current_cluster()
        if not address:
            raise ArgosyError(f"no Ray cluster is running on this host: {FIX}")
    address = address.removeprefix("ray://")
    host, _, port = address.rpartition(":")
    if not host:
        host, port = address, str(DEFAULT_GCS_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgosyError(f"Ray address '{address}' is not HOST:PORT")
    return f"{host}:{port}"


def source_of(address: str | None) -> str:
    """Where `resolve` takes `address` from, in words for an error message."""
    if (address or "auto").strip() != "auto":
        return "--ray-address"
    if os.environ.get("RAY_ADDRESS", "").strip():
        return "$RAY_ADDRESS"
    return (
        f"{CURRENT_CLUSTER}, written by the last `ray start --head` on this host and left "
        "behind when that cluster stopped uncleanly (`ray stop` removes it)"
    )


def check_reachable(
    address: str | None, timeout_s: float = 3.0, head_uids: tuple[int, ...] = ()
) -> str:
    """The resolved address once its GCS port accepts a connection; else `ArgosyError`
    naming the address, where it came from (`source_of`) and the fix."""
    where = resolve(address)
    host, _, port = where.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ArgosyError(
            f"no Ray cluster answers at {where} ({reason} within {timeout_s:g} s; the "
            f"address is from {source_of(address)}): {FIX}"
        ) from None
    refuse_foreign_listener(where, head_uids)
    return where


def refuse_foreign_listener(where: str, head_uids: tuple[int, ...] = ()) -> None:
    """`ArgosyError` when the port at `where` is this host's and held by a user other than
    root, this process's or one of `head_uids`: with the real head down, a job on the
    head's host may bind its port and would be sent this server's Ray token."""
    host, _, port = where.rpartition(":")
    strangers = sorted(listener_uids(host, int(port)) - {0, os.geteuid(), *head_uids})
    if strangers:
        raise ArgosyError(
            f"the process listening at {where} runs as uid {strangers[0]}, neither root nor"
            " this server's user: not a Ray head this server started, perhaps a job that"
            " took the port; no Ray token is sent to it (stop it and start the head, or"
            " name the head's user in ray_head_uids)"
        )


def _current_cluster() -> str:
    """The address `ray start --head` recorded, when the record is this user's or root's
    own file: Ray leaves `/tmp/ray` open to everyone (0777, no sticky bit), so a job on
    the head could put its own address there and take the token a server sends it."""
    path = CURRENT_CLUSTER
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd) as f:
        owner = os.fstat(fd).st_uid
        if owner not in (0, os.geteuid()):
            raise ArgosyError(
                f"{path} is uid {owner}'s, not this user's or root's: it may name anyone's"
                " address; pass --ray-address HOST:PORT (or RAY_ADDRESS) of the head"
            )
        return f.read(4096).strip()


GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A GCS method every client calls first; its empty request is a valid message."""


def asks_for_token(address: str, timeout_s: float = 5.0) -> bool:
    """Whether the GCS at `address` refuses a call without Ray's token (True) or answers
    it (False); `ArgosyError` when it does neither within `timeout_s`."""
    code = _call_gcs(address, (), timeout_s)  # no token sent
    if code is None:
        return False
    if code == "UNAUTHENTICATED":
        return True
    raise ArgosyError(
        f"cannot tell whether the Ray cluster at {address} asks for a token: its GCS"
        f" answered {code}"
    )


def own_token_header() -> dict[str, str]:
    """The token header this process's Ray client would send (Ray's own loader:
    `RAY_AUTH_MODE=token` with `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH` or
    `~/.ray/auth_token`); {} where it would send none."""
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError

    loader = AuthenticationTokenLoader.instance()
    try:
        return dict(loader.get_token_for_http_header()) if loader.has_token() else {}
    except AuthenticationError:
        return {}


def check_own_token(
    address: str, header: dict[str, str] | None = None, timeout_s: float = 5.0
) -> None:
    """`ArgosyError` (the server exits 2) unless the token cluster at `address` accepts
    this process's Ray token (`header`: `own_token_header()`): without it Ray's client
    retries for 20 s and the app fails to start with a traceback."""
    header = own_token_header() if header is None else header
    fix = (
        "start the server with RAY_AUTH_MODE=token and the cluster's token"
        " (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
    )
    if not header:
        raise ArgosyError(
            f"the Ray cluster at {address} asks for Ray's token and this server has none: {fix}"
        )
    code = _call_gcs(address, tuple(header.items()), timeout_s)
    if code == "UNAUTHENTICATED":
        raise ArgosyError(f"the Ray cluster at {address} refuses this server's Ray token: {fix}")
    if code is not None:
        raise ArgosyError(f"the Ray cluster at {address} answered {code} to this server's token")


def _call_gcs(address: str, metadata: tuple[tuple[str, str], ...], timeout_s: float) -> str | None:
    """One `GCS_PROBE` call with `metadata`: None when it is answered, else the gRPC
    status's name and details."""
    import grpc  # Ray's own dependency

    with grpc.insecure_channel(address) as channel:  # no interceptor: only `metadata`
        call = channel.unary_unary(
            GCS_PROBE, request_serializer=lambda _: b"", response_deserializer=bytes
        )
        try:
            call(None, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                return "UNAUTHENTICATED"
            return f"{err.code().name} ({err.details()})"
    return None


def refuse_open_cluster(address: str, probe: Callable[[str], bool] = asks_for_token) -> None:
    """`ArgosyError` (the server exits 2) when jobs are to run as per-queue users on a
    cluster that lets clients in without Ray's token (`probe(address)` is False): a job
    could run code as Ray's user (root) through Ray itself, and no user switch would
    hold it."""
    if probe(address):
        return
    raise ArgosyError(
        f"jobs run as per-queue users (the server is root and allow_root_jobs is off), but"
        f" the Ray cluster at {address} lets any client in without a token, so a job"
        " could run code as Ray's own user through Ray itself: start every node and this"
        " server with token authentication (RAY_AUTH_MODE=token and the same RAY_AUTH_TOKEN,"
        " or Ray's token file), or set allow_root_jobs: true to run jobs as Ray's user"
        " knowingly"
    )
