"""The backend contract: detect cheaply, then list devices.

class MyBackend:
    name = "mine"
    def detect(self) -> bool: ...           # cheap, no side effects
    def inventory(self) -> list[Device]: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Device:
    """One device as its driver reports it, with the catalog chip it matches."""

    backend: str
    index: int
    name: str
    memory_gib: float
    catalog_id: str | None = None
    details: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class AcceleratorBackend(Protocol):
    """What every device backend provides."""

    name: str

    def detect(self) -> bool:
        """True when this backend's devices may be present; cheap and side-effect free."""
        ...

    def inventory(self) -> list[Device]:
        """The devices this backend sees on this machine."""
        ...
