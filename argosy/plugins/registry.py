"""A small typed registry: names and aliases to entries, loaded lazily.

An entry is either the object itself or a dotted path `"package.module:Attr"`; a dotted
path is imported only when the entry is first looked up, so registering the CUDA
backend does not import torch. Unknown names raise `UnknownNameError` listing every
known name and alias, closest first.

    backends: Registry[type[Backend]] = Registry("accelerator backend")
    backends.register("cuda", "argosy.hardware.backends.cuda:CudaBackend", aliases=("nvidia",))
    backends.get("nvidia")  # -> CudaBackend (imported now)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar, cast

from argosy.core.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names (and aliases) to entries of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, entry: T | str, *, aliases: tuple[str, ...] = ()) -> None:
        """Add `entry` under `name`; a name or alias may be registered once only."""
        for key in (name, *aliases):
            if key in self._entries or key in self._aliases:
                raise ValueError(f"{self.kind} '{key}' is already registered")
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name

    def canonical(self, name: str) -> str:
        """The registered name for `name` or one of its aliases."""
        key = name.strip().lower()
        if key in self._entries:
            return key
        if key in self._aliases:
            return self._aliases[key]
        raise UnknownNameError(self.kind, name, self.known())

    def get(self, name: str) -> T:
        """The entry for a name or alias, importing it if it was given as a dotted path."""
        key = self.canonical(name)
        entry = self._entries[key]
        if isinstance(entry, str):
            entry = cast(T, _import_dotted(entry))
            self._entries[key] = entry
        return entry

    def names(self) -> list[str]:
        """Registered names, in registration order, without aliases."""
        return list(self._entries)

    def known(self) -> list[str]:
        """Every name and alias."""
        return [*self._entries, *self._aliases]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.strip().lower() in {*self._entries, *self._aliases}

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


def _import_dotted(path: str) -> object:
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module
