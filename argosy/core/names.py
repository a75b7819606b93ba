"""Closest-match ordering for error messages ("did you mean")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_names(name: str, known: Iterable[str]) -> list[str]:
    """Return every known name, the closest matches to `name` first, then the rest sorted."""
    pool = sorted(set(known))
    close = difflib.get_close_matches(name.lower(), pool, n=len(pool), cutoff=0.4)
    prefix = [k for k in pool if k.startswith(name.lower()[:3]) and k not in close]
    rest = [k for k in pool if k not in close and k not in prefix]
    return close + prefix + rest
