"""Device discovery: ask every registered backend that detects its devices for an inventory.

Accelerator backends come first; the CPU is reported only when no accelerator is found,
or always with `include_cpu=True`.
"""

from __future__ import annotations

from argosy.hardware.backends import Device, backends
from argosy.plugins.registry import Registry


def discover(registry: Registry | None = None, *, include_cpu: bool = False) -> list[Device]:
    """Devices on this machine, accelerators first."""
    registry = registry or backends
    found: list[Device] = []
    for name in registry:
        if name == "cpu":
            continue
        backend = registry.get(name)()
        if backend.detect():
            found.extend(backend.inventory())
    if include_cpu or not found:
        found.extend(registry.get("cpu")().inventory())
    return found
