"""API tokens: `argosy_<id>_<secret>`, shown once, stored as a salted SHA-256.

A token has a public id (what `argosy token list` shows and events name), a queue (None:
an admin token), a name, an optional expiry, and may be revoked. The store keeps the id,
a random salt of its own and sha256(salt + secret), never the token; lookups compare in
constant time. A token made before ids (`argosy_<secret>`, stored as an unsalted
sha256(token) under the id 't' + hash[:12]) still works and is hashed again with a salt
of its own on first use.

An admin token may do everything; a queue token may submit to and cancel in its own
queue and read everything. At first start the server writes its admin token to
`$ARGOSY_HOME/admin.token` (0600) and registers it with any database it is pointed at;
that token acts as `admin` and cannot be revoked through the API.

    tokens = Tokens(store)
    token, row = tokens.create("team-a", "ci", expires_at=None, actor="admin")
    tokens.principal(token).actor      # 'token t1a2b3c4d5e6f (ci)'
    tokens.revoke(row["id"], actor="admin"); tokens.principal(token)   # None
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from argosy.core.errors import ArgosyError
from argosy.server.store import SYSTEM_ACTOR, Row, Store

ADMIN_TOKEN_FILE = "admin.token"
SERVER_CREATOR = "server"
"""`created_by` of the token the server wrote to admin.token."""
MAX_TOKEN_CHARS = 200
"""Longer bearer strings are refused before any hashing or lookup."""
TOKEN_FORMAT = re.compile(r"argosy_(t[0-9a-f]{12})_([A-Za-z0-9_-]{20,})")


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, or a user of one queue, by a token with this id."""

    queue: str | None
    name: str = ""
    token_id: str = ""
    expires_at: float | None = None
    server_admin: bool = False
    """The token the server wrote to admin.token."""

    @property
    def is_admin(self) -> bool:
        return self.queue is None

    @property
    def actor(self) -> str:
        """Who events and the access log name: `admin` (the server's admin token), else
        `token <id> (<name>)`."""
        if self.server_admin:
            return "admin"
        return f"token {self.token_id} ({self.name})" if self.name else f"token {self.token_id}"

    def may_change(self, queue: str) -> bool:
        return self.is_admin or self.queue == queue

    def may_read_output(self, queue: str) -> bool:
        """A job's or service's output (logs) is its queue's and the admins': tenants
        print their data there. Everything else (states, events, queues) any token reads."""
        return self.may_change(queue)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class ProtectedTokenError(ArgosyError):
    """The server's own admin token cannot be revoked through the API."""


def new_token_id() -> str:
    return "t" + secrets.token_hex(6)


def new_token(token_id: str) -> str:
    return f"argosy_{token_id}_{secrets.token_urlsafe(32)}"


def salted_hash(salt: str, secret: str) -> str:
    """Secrets carry 256 random bits, so one salted SHA-256 (no stretching) suffices."""
    return hashlib.sha256((salt + secret).encode()).hexdigest()


def unsalted_hash(token: str) -> str:
    """How tokens were stored before salts (salt '')."""
    return hashlib.sha256(token.encode()).hexdigest()


def candidates(token: str) -> list[tuple[str, str]]:
    """The (id, secret) pairs a bearer string may be: `argosy_<id>_<secret>`, and a
    token made before ids (its id derived from its unsalted hash, its secret itself)."""
    legacy = ("t" + unsalted_hash(token)[:12], token)
    match = TOKEN_FORMAT.fullmatch(token)
    return [(match[1], match[2]), legacy] if match else [legacy]


def matches(row: Row, secret: str) -> bool:
    """Whether `secret` is the token of `row`, compared in constant time."""
    want = salted_hash(row["salt"], secret) if row["salt"] else unsalted_hash(secret)
    return hmac.compare_digest(want, row["hash"])


def principal_of(row: Row) -> Principal:
    return Principal(
        queue=row["queue"],
        name=row["name"],
        token_id=row["id"],
        expires_at=row["expires_at"],
        server_admin=row["created_by"] == SERVER_CREATOR,
    )


def salted_values(secret: str) -> Row:
    """A fresh salt and the hash of `secret` under it."""
    salt = secrets.token_hex(16)
    return {"salt": salt, "hash": salted_hash(salt, secret)}


def ensure_admin_token(store: Store, home: Path) -> Path:
    """Create `<home>/admin.token` (0600) if missing; make sure the store knows it as
    the server's own admin token (salted, like every other)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / ADMIN_TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_token(new_token_id()) + "\n")
    token_id, secret = candidates(path.read_text().strip())[0]
    row = store.token_by_id(token_id)
    if row is None:
        values = {"id": token_id, "queue": None, "name": "admin", "created_by": SERVER_CREATOR}
        store.add_token(values | salted_values(secret))
    elif not matches(row, secret):
        raise ArgosyError(f"{path} does not match the store's token {token_id}")
    else:
        values = {"created_by": SERVER_CREATOR, "revoked_at": None, "expires_at": None}
        store.update_token(token_id, values | (salted_values(secret) if not row["salt"] else {}))
    _revoke_replaced(store, token_id)
    return path


def _revoke_replaced(store: Store, token_id: str) -> None:
    """An admin.token written before this one (its file deleted) no longer works."""
    for row in store.list_tokens():
        live = row["revoked_at"] is None and row["created_by"] == SERVER_CREATOR
        if live and row["id"] != token_id:
            event = ("token_revoked", f"token {row['id']} (admin.token replaced by {token_id})")
            store.revoke_token(row["id"], now=time.time(), event=event, actor=SYSTEM_ACTOR)


class Tokens:
    """Token lookups, creation and revocation, with a cache that never outlives a token:
    expiry is checked on every lookup, and a revoke drops the token's entries."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._ids: dict[str, str] = {}  # sha256(bearer string) -> id, once verified
        self._principals: dict[str, Principal] = {}  # id -> principal of a live token

    def principal(self, token: str) -> Principal | None:
        """Who `token` is; None for an unknown, revoked or expired token."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        key = unsalted_hash(token)  # in memory only
        token_id = self._ids.get(key)
        if token_id is None:
            token_id = self._verify(token)
            if token_id is None:
                return None
            self._ids[key] = token_id
        return self.by_id(token_id)

    def by_id(self, token_id: str) -> Principal | None:
        """The principal of a live token by its id (console sessions hold ids); None for
        an unknown, revoked or expired one."""
        found = self._principals.get(token_id)
        if found is None:
            row = self.store.token_by_id(token_id)
            if row is None or row["revoked_at"] is not None:
                return None
            found = principal_of(row)
        if found.expired(self.clock()):
            self._forget(token_id)
            return None
        self._principals[token_id] = found
        return found

    def _verify(self, token: str) -> str | None:
        """The id of the stored token `token` is, hashing a token made before salts
        again with a salt of its own."""
        for token_id, secret in candidates(token):
            row = self.store.token_by_id(token_id)
            if row is None or not matches(row, secret):
                continue
            if not row["salt"]:
                self.store.update_token(token_id, salted_values(secret), salt_was="")
            return token_id
        return None

    def create(
        self, queue: str | None, name: str, *, expires_at: float | None, actor: str
    ) -> tuple[str, Row]:
        """A new token (shown once) and its stored row (no hash, no salt)."""
        token_id = new_token_id()
        token = new_token(token_id)
        _, secret = candidates(token)[0]
        values = {"id": token_id, "queue": queue, "name": name, "expires_at": expires_at}
        values["created_by"] = actor
        scope = f"queue {queue}" if queue else "admin"
        event = ("token_created", f"token {token_id} ({name}) for {scope}")
        self.store.add_token(values | salted_values(secret), event=event, actor=actor)
        row = self.store.token_by_id(token_id)
        assert row is not None
        return token, public(row)

    def revoke(self, token_id: str, *, actor: str) -> Row | None:
        """Revoke a token and end its console sessions; None for an unknown id. The
        server's own admin token is refused (`ProtectedTokenError`)."""
        row = self.store.token_by_id(token_id)
        if row is None:
            return None
        if row["created_by"] == SERVER_CREATOR:
            raise ProtectedTokenError(
                f"token {token_id} is the server's admin token ({ADMIN_TOKEN_FILE}); "
                "it cannot be revoked (delete the file and restart the server for a new one)"
            )
        self._forget(token_id)
        event = ("token_revoked", f"token {token_id} ({row['name']})")
        self.store.revoke_token(token_id, now=self.clock(), event=event, actor=actor)
        return public(self.store.token_by_id(token_id) or row)

    def rows(self) -> list[Row]:
        """Every token, oldest first, without hashes or salts."""
        return self.store.list_tokens()

    def _forget(self, token_id: str) -> None:
        self._principals.pop(token_id, None)
        for key in [k for k, v in list(self._ids.items()) if v == token_id]:
            del self._ids[key]


def public(row: Row) -> Row:
    """A token's row without its hash and salt."""
    return {k: v for k, v in row.items() if k not in ("hash", "salt")}
