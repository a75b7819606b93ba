"""Is the process on a replica's port the replica argosy started? A proof, not a 200.

A replica is started with a key of its own (`replica_proof_key`: derived from the
server's secret and the service id, never sent on the wire); its `/live?nonce=N`
answers HMAC(key, N, host:port) (`argosy.serving.admin.replica_proof`). Another process
holding the port (a tenant who bound it first) answers without it.

- `probe_health(url, key, where)`: PROVEN, UNPROVEN (200 without the proof) or DOWN;
  the control plane's readiness probe, and the tidal lease's check before it sends a
  replica its admin token.

    probe_health("http://n0:8001/live", replica_proof_key(secret, "s1"), "n0:8001")
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import time
import urllib.parse

from argosy.serving.admin import proof_matches

PROBE_DEADLINE_S = 2.0
"""Wall-clock seconds one probe may take in all (connect, request, answer)."""
PROBE_TIMEOUT_S = PROBE_DEADLINE_S  # the name callers knew
PROBE_HEAD_BYTES = 8192
"""The most of a `/live` answer's status line and headers a probe reads."""
PROBE_READ_BYTES = 4096
"""The most of a `/live` answer a probe reads (the port's owner writes it)."""
PROVEN, UNPROVEN, DOWN = "proven", "unproven", "down"
"""What a probe found: the replica, another process on its port, or no 200."""


def replica_proof_key(secret: bytes, service_id: str) -> bytes:
    """The key a service's replicas prove themselves with: derived from the server's
    secret with a label of its own (neither the admin token nor the API key, which tokens
    can read, gives it), so a restarted server still checks the replicas it adopts."""
    digest = hmac.new(secret, b"replica-proof\0" + service_id.encode(), hashlib.sha256)
    return digest.hexdigest().encode()


def probe_health(url: str, key: bytes, where: str, deadline_s: float = PROBE_DEADLINE_S) -> str:
    """How the liveness route `url` (`/live`) answers a fresh nonce: PROVEN (200 with the
    proof of the replica started to listen on `where` under `key`), UNPROVEN (200 without
    it: another process holds the port) or DOWN (no answer within `deadline_s` in all,
    or not 200). Redirects are not followed. The deadline is wall-clock over the whole
    probe (connect, send, every read): a port that trickles bytes holds it no longer."""
    nonce = secrets.token_hex(16)
    try:
        status, data = _get(f"{url}?nonce={nonce}", time.monotonic() + deadline_s)
    except (OSError, ValueError):
        return DOWN  # ValueError: whatever holds the port may answer garbage
    if status != 200:
        return DOWN
    try:
        answer = json.loads(data).get("proof")
    except (ValueError, AttributeError):
        return UNPROVEN
    if isinstance(answer, str) and proof_matches(key, nonce, where, answer):
        return PROVEN
    return UNPROVEN


def _get(url: str, deadline: float) -> tuple[int, bytes]:
    """(status, up to PROBE_READ_BYTES of body) of a plain HTTP GET of `url`, each step
    bounded by what is left of `deadline` (time.monotonic()); TimeoutError past it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not a plain http URL: {url}")
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    host = parts.netloc.rsplit("@", 1)[-1]
    sock = socket.create_connection((parts.hostname, parts.port or 80), _left(deadline))
    with sock:
        request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        sock.settimeout(_left(deadline))
        sock.sendall(request.encode("ascii"))
        return _parse(_read(sock, deadline))


def _read(sock: socket.socket, deadline: float) -> bytes:
    """What the peer sends until it closes, PROBE_HEAD_BYTES + PROBE_READ_BYTES are in,
    or the body its content-length announces is complete; never past `deadline`."""
    data = b""
    while len(data) < PROBE_HEAD_BYTES + PROBE_READ_BYTES:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(PROBE_HEAD_BYTES + PROBE_READ_BYTES - len(data))
        if not chunk:
            break
        data += chunk
        if _complete(data):
            break
    return data


def _complete(data: bytes) -> bool:
    """Whether `data` holds a whole head and the body its content-length announces."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value.strip())
    return False


def _parse(data: bytes) -> tuple[int, bytes]:
    """(status, body) of a response; ValueError for no status line."""
    head, _, body = data.partition(b"\r\n\r\n")
    fields = head.split(b"\r\n", 1)[0].split()
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        raise ValueError("no HTTP status line")
    return int(fields[1]), body[:PROBE_READ_BYTES]


def _left(deadline: float) -> float:
    """Seconds left before `deadline`; TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("probe deadline passed")
    return left
