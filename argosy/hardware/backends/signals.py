"""Optional backend capability: vendor health signals (ECC, row remapping, XID, slowdown).

A backend that can read its devices' own health counters implements
`SupportsHealthSignals`; the health layer judges the raw figures. A backend that offers it
but cannot read them on this machine (no NVML library, no driver) raises
`SignalsUnavailableError` with the reason, which the health layer reports as not applicable.

    if isinstance(backend, SupportsHealthSignals):
        signals = backend.health_signals(window_s=2.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SIGNAL_NAMES = (
    "ecc_uncorrected",
    "ecc_corrected",
    "remap_pending",
    "remap_failed",
    "xid_critical",
    "hw_slowdown",
    "power_capped",
    "thermal_throttle",
)
"""Raw counters a backend may report, per device:

- ecc_uncorrected / ecc_corrected: volatile ECC error counts since the driver loaded;
- remap_pending: 1 when a memory row remap waits for a GPU reset; remap_failed: 1 when a
  remap failed (the device needs service);
- xid_critical: critical XID events seen while the signals were read;
- hw_slowdown: 1 when a hardware, thermal or power-brake slowdown is active now;
- power_capped: the share of the device's default power limit that its enforced limit
  cuts (0.3: capped at 70% of the default), so it cannot draw what its clocks need;
- thermal_throttle: 1 when the driver holds the clocks down for temperature now (software
  thermal slowdown; the hardware one is in hw_slowdown).
"""


@dataclass(frozen=True)
class VendorSignal:
    """One raw health counter of one device, as the vendor library reports it."""

    device_index: int
    name: str
    value: float
    detail: str = ""

    def __post_init__(self) -> None:
        if self.name not in SIGNAL_NAMES:
            raise ValueError(f"unknown vendor signal '{self.name}'; known: {SIGNAL_NAMES}")


class SignalsUnavailableError(RuntimeError):
    """The backend offers signals but cannot read them on this machine; says why."""


@runtime_checkable
class SupportsHealthSignals(Protocol):
    """Backends that can read their devices' health counters."""

    def health_signals(self, window_s: float = 0.0) -> list[VendorSignal]:
        """Counters of every device; event signals (XID) are collected for `window_s`."""
        ...
