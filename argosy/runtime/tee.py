"""`--tee`: follow the ranks' log files and hand on each new line, prefixed by its rank.

Ranks write to `logs/attempt<N>/rank<R>.log` (cold or warm started alike); the follower
reads what was appended since its last call, so it never blocks a rank and never loses a
line: a partial last line waits until its newline comes or `flush` is called.

    tee = RankTee({0: path0, 1: path1}, print)
    tee.pump()      # prints "[rank1]: loss 3.2" for every complete new line
    tee.flush()     # at the attempt's end: what is left, newline or not
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

MAX_READ_BYTES = 1 << 20
"""Most bytes read from one log per call, so a chatty rank cannot stall the agent."""


class RankTee:
    """Follows one attempt's rank logs."""

    def __init__(self, logs: dict[int, Path], emit: Callable[[str], None]) -> None:
        self._logs = logs
        self._emit = emit
        self._offsets = dict.fromkeys(logs, 0)
        self._partial = dict.fromkeys(logs, b"")

    def pump(self) -> int:
        """Hand on every complete new line; how many lines were handed on."""
        count = 0
        for rank, path in self._logs.items():
            data = self._partial[rank] + self._read(rank, path)
            *lines, self._partial[rank] = data.split(b"\n")
            for line in lines:
                self._emit(prefixed(rank, line))
            count += len(lines)
        return count

    def flush(self) -> int:
        """Hand on what is left, including a last line without its newline."""
        count = self.pump()
        for rank, rest in self._partial.items():
            if rest:
                self._emit(prefixed(rank, rest))
                self._partial[rank] = b""
                count += 1
        return count

    def _read(self, rank: int, path: Path) -> bytes:
        try:
            with path.open("rb") as f:
                f.seek(self._offsets[rank])
                data = f.read(MAX_READ_BYTES)
        except FileNotFoundError:
            return b""
        self._offsets[rank] += len(data)
        return data


def prefixed(rank: int, line: bytes) -> str:
    """torchrun's form: `[rank1]: text`."""
    return f"[rank{rank}]: {line.decode(errors='replace').rstrip()}"
