"""Running a coroutine to its end from a synchronous test, whatever runs in the thread.

A session-scoped Playwright browser (tests/console) keeps an event loop running in the
main thread of the xdist worker that holds it, and `asyncio.run` refuses to start a loop
there. `run_async(coro)` runs it on a fresh loop in a thread of its own instead, so a test
does not depend on which tests shared its worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on a thread of its own; its result, or its exception."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
