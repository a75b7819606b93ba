"""Emulated slow devices: a work-inflating throttle for the check harness (emulation only).

A real slow device (thermal or power capping, a lower clock, a failing memory stack) needs
more time for the same work. The throttle reproduces that on any machine: a throttled rank
asked to do `iters` iterations of a probe runs `iters / factor` of them (rounded) while
being credited with `iters`, so its measured throughput is `factor` times what the device
delivers, as if it ran at that share of its clock. Busy work rather than sleep keeps the
emulation visible to CPU-time clocks and to the same scheduler pressure as real work.
It exists only to test that the checks find such a device and measure its factor.

    throttle = Throttle(0.5)
    throttle.iterations(10)   # 20: half speed
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.core.errors import ConfigError


@dataclass(frozen=True)
class Throttle:
    """Slows a rank to `factor` of its speed by running extra iterations of the same work."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.factor <= 1:
            raise ConfigError(f"throttle factor must be in (0, 1], got {self.factor:g}")

    def iterations(self, iters: int) -> int:
        """Iterations to run for `iters` credited ones (at least `iters`)."""
        if iters < 0:
            raise ValueError(f"iterations must be non-negative, got {iters}")
        return max(iters, round(iters / self.factor))


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
            raise ConfigError(f"--emulate-slow '{spec}': factor must be in (0, 1]")
        if num_ranks is not None and rank >= num_ranks:
            raise ConfigError(f"--emulate-slow '{spec}': rank {rank} of {num_ranks} ranks")
        if rank in slow:
            raise ConfigError(f"--emulate-slow: rank {rank} given twice")
        slow[rank] = factor
    return slow
