"""Who listens on a port of this host: the owner of a listening TCP socket, from the
kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`).

A secret sent to an address of this host (Ray's token to the head's GCS) goes to whatever
process holds the port. When the real one is down, any local user (a job) may bind it;
`listener_uids(host, port)` says who holds it, so the sender can refuse a stranger. For an
address of another host it says nothing (an empty set): only that host's kernel knows.

    listener_uids("127.0.0.1", 6379)     # {0}: root's GCS; {2001}: a job's impostor
    anyone_may_bind("127.0.0.1", 6379)   # True: a job could take it while the head is down
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import time
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
UNPRIVILEGED_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
"""The lowest port any user may bind (Linux; 1024 unless an admin changed it)."""
LISTEN = "0A"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def listener_uids(host: str, port: int, tables: tuple[Path, ...] = TABLES) -> set[int]:
    """The uids of the sockets listening on `port` at `host` (or on every address) of
    this host; empty when `host` is not this host's or nothing listens."""
    local = _local_addresses(host)
    if not local:
        return set()
    uids = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for address, listen_port, uid in parse_listeners(table.read_text()):
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped  # a dual-stack socket's IPv4 address
                if listen_port == port and (address.is_unspecified or address in local):
                    uids.add(uid)
    return uids


def parse_listeners(text: str) -> list[tuple[Address, int, int]]:
    """(address, port, uid) of each listening socket in a `/proc/net/tcp[6]` table; a
    line it cannot read is skipped."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[3] != LISTEN:
            continue
        try:
            hex_address, hex_port = fields[1].split(":")
            out.append((_address(hex_address), int(hex_port, 16), int(fields[7])))
        except ValueError:
            continue
    return out


def _address(hex_address: str) -> Address:
    """The kernel's hex address: 32-bit words in this host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    if len(raw) not in (4, 16):
        raise ValueError(f"not an IPv4 or IPv6 address: {hex_address}")
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def anyone_may_bind(host: str, port: int, sysctl: Path = UNPRIVILEGED_START) -> bool:
    """Whether `host` is this host's and any local user (a job) may bind `port` there
    once its owner is gone: a client that reconnects by itself (Ray's, to a head that
    went down) would then send its secret to whoever took it. A privileged port (below
    `ip_unprivileged_port_start`) cannot be taken so."""
    if not _local_addresses(host):
        return False
    try:
        start = int(sysctl.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        start = 1024
    return port >= start


def is_this_host(ip: str) -> bool:
    """Whether `ip` is one of this host's addresses (loopback, or one it may bind)."""
    try:
        if ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback:
            return True
    except ValueError:
        return False
    return bool(_local_addresses(ip))


def _local_addresses(host: str) -> set[Address]:
    """The addresses `host` resolves to that belong to this host (one can bind them)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    local = set()
    for family, _, _, _, sockaddr in infos:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((sockaddr[0], 0))
            local.add(ipaddress.ip_address(sockaddr[0]))
    return local


LOOPBACKS = ("127.0.0.1", "::1")


def companion_addresses(host: str) -> list[str]:
    """The addresses a server asked to listen at `host` binds: `host` itself and, when
    `host` takes in one loopback family (127.0.0.1, ::1, localhost, a wildcard), the
    other family's loopback too, so that no local user (a job) can take `[::1]:port`
    (or `127.0.0.1:port`) beside it and answer clients that reach the server there."""
    bare = host.strip("[]")
    if bare in ("", "0.0.0.0", "127.0.0.1", "localhost"):
        return [bare or "0.0.0.0", "::1"]
    if bare in ("::1", "::"):
        return [bare, "127.0.0.1"]
    return [bare]


def bind_listening(host: str, port: int, backlog: int = 2048) -> list[socket.socket]:
    """Listening TCP sockets at `host:port` and its companion loopback address (see
    `companion_addresses`; skipped where this host has no such family). `PortHeldError`
    naming the owner uids when an address is taken; a port of 0 is chosen by the kernel
    for the first address and reused for the others."""
    sockets: list[socket.socket] = []
    try:
        for i, address in enumerate(companion_addresses(host)):
            sock = _bind(address, port, required=i == 0)
            if sock is None:
                continue
            sockets.append(sock)
            port = sock.getsockname()[1]
        for sock in sockets:
            sock.listen(backlog)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class PortHeldError(OSError):
    """An address this server would bind is held by another socket (`uids`: its owners,
    from the kernel's tables; empty when they cannot be told)."""

    def __init__(self, address: str, port: int, uids: set[int]) -> None:
        owners = ", ".join(str(u) for u in sorted(uids)) or "unknown"
        where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        super().__init__(f"port {where} is already in use (held by uid {owners})")
        self.address, self.port, self.uids = address, port, uids


def _bind(address: str, port: int, *, required: bool) -> socket.socket | None:
    """A bound socket at `address:port`; None for a companion address whose family this
    host lacks; `PortHeldError` when it is taken."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        if required:
            raise
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortHeldError(address, port, listener_uids(address, port)) from err
        if required:
            raise
        return None  # EADDRNOTAVAIL, EAFNOSUPPORT: no such loopback here
    sock.set_inheritable(False)
    return sock


def socket_uid(
    ip: str, port: int, to: tuple[str, int] | None = None, tables: tuple[Path, ...] = TABLES
) -> int | None:
    """The uid owning the established TCP socket of this host whose local address is
    `ip:port` (and whose remote one is `to`, when given): the client end of a loopback
    connection, as the server sees its peer. None when no table has it or it cannot be
    read."""
    return SocketOwners(tables).uid(ip, port, to)


ESTABLISHED = "01"
CONNECTED = frozenset({"01", "02", "03", "04", "05", "08", "09", "0B", "0C"})
"""Every state of a connection's full socket, half-closed ones included (FIN_WAIT, a
peer that shut its writing down): not LISTEN, CLOSE, nor TIME_WAIT, whose rows name
uid 0 whoever owned the socket."""


class SocketOwners:
    """Owners of this host's established TCP sockets, from one read of the kernel's
    tables, read again only when asked about a socket the last read did not hold (or
    one older than `max_age_s`): a burst of connections accepted together costs one
    read, not one each.

        owners = SocketOwners()
        owners.uid("127.0.0.2", 40312, ("127.0.0.1", 8275))   # 2001: a job's socket
    """

    def __init__(
        self,
        tables: tuple[Path, ...] = TABLES,
        max_age_s: float = 0.25,
        states: frozenset[str] = frozenset({ESTABLISHED}),
    ) -> None:
        self.tables = tables
        self.max_age_s = max_age_s
        self.states = states
        self._owners: dict[str, int] = {}  # "local remote" (kernel hex) -> uid
        self._read_at = float("-inf")

    def uid(self, ip: str, port: int, to: tuple[str, int] | None = None) -> int | None:
        """The uid of the socket bound at `ip:port` (connected to `to`); None: unknown."""
        keys = _keys(ip, port, to)
        if not keys:
            return None
        fresh = time.monotonic() - self._read_at <= self.max_age_s
        found = self._find(keys) if fresh else None
        if found is None:
            self._read()
            found = self._find(keys)
        return found

    def _find(self, keys: list[str]) -> int | None:
        for key in keys:
            if key.endswith(" *"):  # any remote: the first row with that local address
                local = key[:-1]
                hits = [u for k, u in self._owners.items() if k.startswith(local)]
                if hits:
                    return hits[0]
            elif key in self._owners:
                return self._owners[key]
        return None

    def _read(self) -> None:
        owners: dict[str, int] = {}
        for table in self.tables:
            try:
                text = table.read_text()
            except OSError:
                continue
            for line in text.splitlines()[1:]:
                fields = line.split()
                if len(fields) > 7 and fields[3] in self.states:
                    with contextlib.suppress(ValueError):
                        owners[f"{fields[1]} {fields[2]}"] = int(fields[7])
        self._owners, self._read_at = owners, time.monotonic()


def _keys(ip: str, port: int, to: tuple[str, int] | None) -> list[str]:
    """The table keys ("local remote", kernel hex) a socket at `ip:port` connected to
    `to` may have: in the IPv4 table, and (as IPv4-mapped) in the IPv6 one."""
    local = _forms(ip)
    remote = _forms(to[0]) if to is not None else []
    out = []
    for family, address in local:
        there = [a for f, a in remote if f == family]
        if to is None:
            out.append(f"{_hex(address)}:{port:04X} *")
        for other in there:
            out.append(f"{_hex(address)}:{port:04X} {_hex(other)}:{to[1]:04X}")
    return out


def _forms(host: str) -> list[tuple[int, Address]]:
    """`host` as it may appear in the IPv4 table (4) and the IPv6 table (6)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return []
    if isinstance(address, ipaddress.IPv4Address):
        return [(4, address), (6, ipaddress.IPv6Address(f"::ffff:{address}"))]
    if address.ipv4_mapped is not None:
        return [(4, address.ipv4_mapped), (6, address)]
    return [(6, address)]


def _hex(address: Address) -> str:
    """The kernel's hex form of `address` (32-bit words in little-endian order)."""
    raw = address.packed
    return b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)).hex().upper()
