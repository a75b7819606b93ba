"""What the tidal tests share: a scheduler config under which resizes pay at once, and
a replica admin whose replicas sleep and wake at once."""

from __future__ import annotations

from typing import Any

from argosy.scheduler.config import SchedulerConfig

FAST = SchedulerConfig(
    resize_cost_s=1.0,
    resize_payback=1.0,
    initial_hold_s=10.0,
    min_resize_interval_s=0.0,
    resize_budget_fraction=1.0,
    min_runtime_s=0.0,
)
"""Resizes cost 1 s and pay for themselves after 1 s; nothing waits to resize."""


class InstantAdmin:
    """Replicas that sleep and wake at once."""

    def sleep(self, url: str, token: str, level: int) -> dict[str, Any]:
        return {"state": "asleep", "level": level, "seconds": 0.0, "resident_bytes": 1}

    def wake(self, url: str, token: str) -> dict[str, Any]:
        return {"state": "awake", "level": 0, "seconds": 0.0, "resident_bytes": 2}

    def prove(self, url: str, key: bytes, where: str) -> None:
        return None

    def first_token(self, url: str, model: str, api_key: str) -> float:
        return 0.0
