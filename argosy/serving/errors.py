"""Serving errors the API maps to HTTP statuses: asleep is 503, a failed worker is 500."""

from __future__ import annotations


class EngineAsleepError(RuntimeError):
    """The engine sleeps (or has not loaded); the request may be retried after wake."""


class EngineFailedError(RuntimeError):
    """The engine's worker process stopped or raised something unexpected."""
