"""How fast each token may change things: a token bucket per token id.

A bucket holds up to `burst` changes and refills at `rate_per_s`; a change takes one.
`wait_s(key)` takes one and answers 0.0, or, when the bucket is empty, answers how long
until one is there (taking nothing: a refused request costs its token nothing). Keys
are token ids, known only after authentication, so the table is as large as the
tokens in use; full buckets (idle tokens) are dropped from it now and then.

    limits = RateLimits(rate_per_s=20.0, burst=1000)
    if (wait := limits.wait_s(principal.token_id)) > 0:
        ...  # 429, Retry-After: ceil(wait); `refuse_if_too_fast(request, who)` does it
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from fastapi import HTTPException, Request

from argosy.server.auth import Principal

PRUNE_EVERY = 1024
"""Takes between two sweeps of full buckets out of the table."""
FULL_ENOUGH = 1e-9
"""A change's worth less this counts as one: waiting exactly the time `wait_s` named
refills the bucket up to a rounding error, and that wait must be enough."""


class RateLimits:
    """One token bucket per key."""

    def __init__(
        self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (level, as of when)
        self._takes = 0

    @property
    def on(self) -> bool:
        return self.rate_per_s > 0

    def wait_s(self, key: str) -> float:
        """0.0 after taking one change from `key`'s bucket; else the seconds until one."""
        if not self.on:
            return 0.0
        now = self._clock()
        level = self._level(key, now)
        if level < 1.0 - FULL_ENOUGH:
            return (1.0 - level) / self.rate_per_s
        self._buckets[key] = (max(0.0, level - 1.0), now)
        self._takes += 1
        if self._takes % PRUNE_EVERY == 0:
            self._prune(now)
        return 0.0

    def _level(self, key: str, now: float) -> float:
        level, since = self._buckets.get(key, (self.burst, now))
        return min(self.burst, level + max(0.0, now - since) * self.rate_per_s)

    def _prune(self, now: float) -> None:
        full = [k for k in self._buckets if self._level(k, now) >= self.burst]
        for key in full:
            del self._buckets[key]


def refuse_if_too_fast(request: Request, who: Principal) -> None:
    """A 429 with Retry-After when `who`'s token has used up its changes for now (the
    app's `limits`; the server's own admin token is never limited)."""
    limits: RateLimits | None = getattr(request.app.state, "limits", None)
    if limits is None or who.server_admin:
        return
    wait = limits.wait_s(who.token_id)
    if wait > 0:
        seconds = max(1, math.ceil(wait))
        raise HTTPException(
            429,
            f"too many changes from this token: at most {limits.rate_per_s:g} per second"
            f" after a burst of {limits.burst:g} (token_writes_per_s); retry in {seconds} s",
            {"Retry-After": str(seconds)},
        )
