"""Domain errors shared by every layer.

`ArgosyError` is a user mistake or an impossible request; the CLI turns it into a
one-line message and exit code 2, never a traceback. Internal invariants use `assert`.
"""

from __future__ import annotations

from collections.abc import Iterable

from argosy.core.names import closest_names


class ArgosyError(Exception):
    """A mistake in what the user asked for; the message says what and where."""


class ConfigError(ArgosyError):
    """A malformed file, shorthand or setting.

    `source` is a file name or the literal text; `line` is 1-based when known; `field`
    is the dotted path of the offending key.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source + (f":{self.line}" if self.line is not None else "")
        if self.field:
            where = f"{where} field '{self.field}'" if where else f"field '{self.field}'"
        return f"{where}: {self.message}" if where else self.message


class UnknownNameError(ArgosyError, KeyError):
    """A name that is not in a registry or catalog; lists the known ones, closest first."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(set(known))
        ordered = closest_names(name, self.known)
        super().__init__(f"unknown {kind} '{name}'; known: {', '.join(ordered)}")

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])
