"""Console login sessions: a random session id in the browser's cookie, its SHA-256 in
the `sessions` table, never the API token itself.

    sessions = Sessions(store, tokens, ttl_s=12 * 3600)
    session_id, session = sessions.open(who)     # at login: the cookie's value
    session = sessions.get(session_id)           # each request: None once expired,
                                                 # logged out, or its token revoked
    sessions.close(session_id)                   # logout: the old cookie stops working

A session holds the token's id (not the token), a per-session CSRF token that every
console form sends back, and an expiry. Each lookup asks `Tokens.by_id` again, so a
revoked or expired token ends its sessions at once, whatever their own expiry. Live
rows are cached in memory (a lookup in the store costs about 0.4 ms, a page 2 to 15):
right for the one server a store has, since logout goes through `close` and revocation
through `Tokens`, both of which this lookup sees at once.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from argosy.server.auth import Principal, Tokens
from argosy.server.store import Store
from argosy.server.tables import sessions as table

MAX_SESSION_ID_CHARS = 100
"""A longer cookie is not one of ours (ids are 43 characters); it is not even hashed."""
MAX_CACHED = 4096
"""Sessions kept in memory; past it the cache starts again (the store has them all)."""
MAX_PER_TOKEN = 64
"""Live sessions one token may hold (browsers logged in with it); a login past it ends
that token's oldest session."""


@dataclass(frozen=True)
class Session:
    """A live console session: who it acts as, its CSRF token, when it ends."""

    principal: Principal
    csrf: str
    expires_at: float


def session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """Opens, finds and closes console sessions in the store."""

    def __init__(
        self, store: Store, tokens: Tokens, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.tokens = tokens
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[str, tuple[str, str, float]] = {}  # hash -> (token id, csrf, expiry)

    def open(self, who: Principal) -> tuple[str, Session]:
        """A new session for `who`; returns the id for the cookie (shown only here)."""
        now = self.clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(who, secrets.token_urlsafe(32), now + self.ttl_s)
        row = {
            "hash": session_hash(session_id),
            "token_id": who.token_id,
            "csrf": session.csrf,
            "created_at": now,
            "expires_at": session.expires_at,
        }
        with self.store.engine.begin() as c:
            c.execute(table.delete().where(table.c.expires_at <= now))  # keep the table small
            c.execute(table.insert().values(row))
            mine = select(table.c.hash).where(table.c.token_id == who.token_id)
            newest_first = mine.order_by(table.c.created_at.desc(), table.c.expires_at.desc())
            older = c.execute(newest_first.offset(MAX_PER_TOKEN)).scalars().all()
            if older:  # one token's oldest sessions go: a login loop cannot grow the table
                c.execute(table.delete().where(table.c.hash.in_(older)))
        for digest in older:
            self._cache.pop(digest, None)
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        """The live session of this id, or None (unknown, expired, or its token gone)."""
        if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
            return None
        digest = session_hash(session_id)
        found = self._cache.get(digest) or self._load(digest)
        if found is None:
            return None
        token_id, csrf, expires_at = found
        who = self.tokens.by_id(token_id) if expires_at > self.clock() else None
        if who is None:
            self._delete(digest)
            return None
        return Session(who, csrf, expires_at)

    def close(self, session_id: str) -> None:
        """Log out: the session's row is deleted, so its cookie no longer works."""
        if session_id and len(session_id) <= MAX_SESSION_ID_CHARS:
            self._delete(session_hash(session_id))

    def _load(self, digest: str) -> tuple[str, str, float] | None:
        with self.store.engine.connect() as c:
            row = c.execute(select(table).where(table.c.hash == digest)).first()
        if row is None:
            return None
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        found = self._cache[digest] = (row.token_id, row.csrf, row.expires_at)
        return found

    def _delete(self, digest: str) -> None:
        self._cache.pop(digest, None)
        with self.store.engine.begin() as c:
            c.execute(table.delete().where(table.c.hash == digest))
