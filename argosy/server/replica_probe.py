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
import http.client
import json
import secrets
import urllib.error
import urllib.request
from typing import Any

from argosy.serving.admin import proof_matches

PROBE_TIMEOUT_S = 2.0
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


def probe_health(url: str, key: bytes, where: str) -> str:
    """How the liveness route `url` (`/live`) answers a fresh nonce: PROVEN (200 with the
    proof of the replica started to listen on `where` under `key`), UNPROVEN (200 without
    it: another process holds the port) or DOWN (no answer, or not 200). Redirects are
    not followed."""
    nonce = secrets.token_hex(16)
    try:
        with _OPENER.open(f"{url}?nonce={nonce}", timeout=PROBE_TIMEOUT_S) as response:
            if response.status != 200:
                return DOWN
            data = response.read(PROBE_READ_BYTES)
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return DOWN  # HTTPException: whatever holds the port may answer garbage
    try:
        answer = json.loads(data).get("proof")
    except (ValueError, AttributeError):
        return UNPROVEN
    if isinstance(answer, str) and proof_matches(key, nonce, where, answer):
        return PROVEN
    return UNPROVEN


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer that is not 200


_OPENER = urllib.request.build_opener(_NoRedirect)
