"""Value types with no dependencies on the rest of argosy: errors, clocks, name lookup.

Every other layer may import `argosy.core`; `argosy.core` imports nothing of ours.
"""

from argosy.core.clock import Clock, FakeClock, SystemClock
from argosy.core.errors import ArgosyError, ConfigError, UnknownNameError
from argosy.core.names import closest_names

__all__ = [
    "ArgosyError",
    "Clock",
    "ConfigError",
    "FakeClock",
    "SystemClock",
    "UnknownNameError",
    "closest_names",
]
