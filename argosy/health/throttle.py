"""Emulated slow devices: a throttle for the check harness (emulation only).

A real slow device (thermal or power capping, a lower clock, a failing memory stack) gets
less useful work done in the same time. The throttle reproduces that on any machine: a
throttled rank runs its probes like the others, but only `factor` of the iterations it
runs count as useful work, as if each useful iteration had cost it `1 / factor` of them.
Its measured throughput is then `factor` times what the device delivers, with all the
noise of the real measurement. Busy work rather than sleep keeps the rank's use of the
shared machine (cores, caches, memory) the same as real work. It exists only to test that
the checks find such a device and measure its factor; nothing in the product uses it.

    Throttle(0.5).useful(40)   # 20.0: half speed
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.core.errors import ConfigError


@dataclass(frozen=True)
class Throttle:
    """Slows a rank to `factor` of its speed: only that share of its work counts."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.factor <= 1:
            raise ConfigError(f"throttle factor must be in (0, 1], got {self.factor:g}")

    def useful(self, runs: float) -> float:
        """Useful iterations among `runs` run (the rest emulate the slowness)."""
        if runs < 0:
            raise ValueError(f"runs must be non-negative, got {runs}")
        return runs * self.factor


def parse_slow(specs: list[str], num_ranks: int | None = None) -> dict[int, float]:
    """Parse `RANK:FACTOR` items (e.g. `1:0.5`) into {rank: factor}; bad input raises."""
    slow: dict[int, float] = {}
    for spec in specs:
        rank_text, sep, factor_text = spec.partition(":")
        try:
            rank, factor = int(rank_text), float(factor_text)
        except ValueError:
            rank, factor = -1, 0.0
        if not sep or rank < 0:
            raise ConfigError(f"--emulate-slow '{spec}': expected RANK:FACTOR, e.g. 1:0.5")
        if not 0 < factor <= 1:
            raise ConfigError(
                f"--emulate-slow '{spec}': factor must be in (0, 1], the speed kept (0.5: half "
                "speed; --inject slow takes the slowdown instead, 2)"
            )
        if num_ranks is not None and rank >= num_ranks:
            raise ConfigError(f"--emulate-slow '{spec}': rank {rank} of {num_ranks} ranks")
        if rank in slow:
            raise ConfigError(f"--emulate-slow: rank {rank} given twice")
        slow[rank] = factor
    return slow
