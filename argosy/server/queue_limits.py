"""What one queue may hold at once: jobs waiting to start (`max_pending_jobs_per_queue`)
and services (`max_services_per_queue`). Past either, a submit is a `QueueFullError`,
which the API answers 429 with the limit's name, so one tenant cannot grow the store and
the scheduler's queue without bound (Slurm's MaxSubmitJobs). A limit of 0 is none.

    refuse_waiting_past(5000, "team-a", waiting=12, answered=lambda: False)   # passes
"""

from __future__ import annotations

from collections.abc import Callable

from argosy.core.errors import ArgosyError


class QueueFullError(ArgosyError):
    """A queue already holds the most that it may (the API answers 429)."""


def refuse_waiting_past(limit: int, queue: str, waiting: int, answered: Callable[[], bool]) -> None:
    """`QueueFullError` when `queue` has `limit` jobs waiting, unless `answered()` (a
    submit whose Idempotency-Key already has its job: asked only when full)."""
    if not limit or waiting < limit or answered():
        return
    raise QueueFullError(
        f"queue '{queue}' has {waiting} jobs waiting to start, the most it may"
        f" (max_pending_jobs_per_queue: {limit}): cancel some, or submit when some"
        " have started"
    )


def refuse_services_past(limit: int, queue: str, held: int) -> None:
    """`QueueFullError` when `queue` holds `limit` services already."""
    if limit and held >= limit:
        raise QueueFullError(
            f"queue '{queue}' has {held} services, the most it may"
            f" (max_services_per_queue: {limit}): delete one first"
        )
