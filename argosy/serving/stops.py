"""Stop strings over streamed text: hold back what could be the start of a stop string."""

from __future__ import annotations


class StopMatcher:
    """Feeds text deltas; releases text that cannot be part of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""
        self.cut = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """Releasable text, and whether a stop string was hit."""
        if not self.stops:
            return delta, False
        self.pending += delta
        hits = [self.pending.find(s) for s in self.stops if s in self.pending]
        if hits:
            self.cut = self.pending[: min(hits)]
            self.pending = ""
            return "", True
        keep = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        return out, False

    def flush_before_stop(self) -> str:
        """Text before the stop string that was hit."""
        return self.cut

    def flush(self) -> str:
        """Everything held back (the generation ended without a stop string)."""
        out, self.pending = self.pending, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0
