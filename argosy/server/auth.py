"""API tokens: random secrets shown once, stored as SHA-256 hashes.

An admin token (queue None) may do everything; a queue token may submit to and cancel
in its own queue and read everything. At first start the server writes an admin token
to `$ARGOSY_HOME/admin.token` with mode 0600 (and registers its hash with any new
database it is pointed at later).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from argosy.server.store import Store

ADMIN_TOKEN_FILE = "admin.token"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, or a user of one queue."""

    queue: str | None
    name: str = ""

    @property
    def is_admin(self) -> bool:
        return self.queue is None

    def may_change(self, queue: str) -> bool:
        return self.is_admin or self.queue == queue


def new_token() -> str:
    return "argosy_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Tokens carry 256 random bits, so one SHA-256 (no salt, no stretching) suffices."""
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_admin_token(store: Store, home: Path) -> Path:
    """Create `<home>/admin.token` (0600) if missing; make sure the store knows it."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / ADMIN_TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_token() + "\n")
    token = path.read_text().strip()
    if store.token(hash_token(token)) is None:
        store.add_token(hash_token(token), None, "admin")
    return path


class Tokens:
    """Token lookups with a small cache (tokens are never deleted through the API)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, Principal] = {}

    def principal(self, token: str) -> Principal | None:
        digest = hash_token(token)
        found = self._cache.get(digest)
        if found is None:
            row = self.store.token(digest)
            if row is None:
                return None
            found = self._cache[digest] = Principal(row["queue"], row["name"])
        return found

    def create(self, queue: str | None, name: str) -> str:
        token = new_token()
        self.store.add_token(hash_token(token), queue, name)
        return token
