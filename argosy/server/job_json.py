"""JSON a job wrote, as the server may hold it: strict, finite, bounded.

A job's files (`summary.json`, `node_health.json`, `events.jsonl`, `energy.jsonl`) are
written by tenant code. Python's `json` takes `NaN`, `Infinity`, integers of any length
and nesting until the interpreter's recursion limit; kept as they are, one such value
makes the store's JSON unreadable to SQLite, `/metrics` and every tenant's job list, and
`float(10**400)` raises where the server does arithmetic. So:

- `loads_job_json(text)`: `json.loads`, refusing (ValueError) non-finite numbers
  (`NaN`, `Infinity`, `1e999`), integers beyond 64 bits and nesting deeper than
  `MAX_DEPTH`;
- `number(value, low=None, high=None)`: a finite int/float within bounds, else None;
- `clip_text(value, limit)`: a value shown as text, at most `limit` characters.

    data = loads_job_json(read_job_text(path, limit=...) or "")   # ValueError: ignore it
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of lists and objects taken from a job's JSON."""
_INT_BOUND = 1 << 63


def loads_job_json(text: str | bytes) -> Any:
    """The JSON value of `text`, or ValueError when it is not strict, finite JSON."""
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_int=_int, parse_float=_float
        )
    except RecursionError as err:
        raise ValueError("JSON nested too deep") from err
    _check_depth(value, 0)
    return value


def number(value: Any, low: float | None = None, high: float | None = None) -> float | None:
    """`value` when it is a finite number (not a bool) within [low, high], else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or (low is not None and value < low):
        return None
    return None if high is not None and value > high else value


def clip_text(value: Any, limit: int) -> str:
    """`value` as text (None: ""), cut to `limit` characters."""
    return "" if value is None else str(value)[:limit]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in a job's JSON")


def _int(text: str) -> int:
    value = int(text)
    if not -_INT_BOUND <= value < _INT_BOUND:
        raise ValueError("an integer beyond 64 bits in a job's JSON")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text[:20]} in a job's JSON")
    return value


def _check_depth(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_depth(item, depth + 1)
