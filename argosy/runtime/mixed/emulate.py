"""Chip emulation: give CPU ranks chip identities and throttle them to their chip's speed.

EMULATION, not a measurement of the chips: every rank computes on the host CPU; a rank
that plays a chip with a lower dense bf16 peak (catalog `bf16_tflops`) than the fastest
chip of the launch sleeps, after each throttled block, the block's measured time times
(fastest peak / its peak - 1). So a rank playing an A100 (312 TFLOPs) beside an H100
(989) takes 3.17x as long per micro-batch as the H100 rank. Everything else (memory,
links, MFU differences between chips) is not emulated. Each report that carries
emulated figures says so (`describe()`).

    speeds = emulated_speeds([("h100", 1), ("a100-80g", 2)], catalog)   # per rank
    throttle = Throttle(speeds[rank].slowdown)
    with throttle.block():
        loss = model(x, y)       # real compute; the sleep follows
    throttle.oversleep_s         # sleep taken beyond what was asked: the emulation's cost
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from argosy.hardware.catalog import Catalog

ENV_EMULATE = "ARGOSY_EMULATE_CHIPS"
"""The --emulate-chips spec as the ranks see it."""


@dataclass(frozen=True)
class EmulatedChip:
    """The chip a rank plays and how much slower than the fastest chip of the launch."""

    chip: str
    peak_tflops: float
    slowdown: float
    """fastest peak / this chip's peak (>= 1)."""


def emulated_speeds(chips: list[tuple[str, int]], catalog: Catalog) -> list[EmulatedChip]:
    """One entry per rank, in the order of `chips` (names resolved by the catalog)."""
    resolved = [(catalog.get(name), count) for name, count in chips]
    fastest = max(chip.peak_tflops("bf16") for chip, _ in resolved)
    out: list[EmulatedChip] = []
    for chip, count in resolved:
        peak = chip.peak_tflops("bf16")
        out += [EmulatedChip(chip.id, peak, fastest / peak)] * count
    return out


def canonical_counts(chips: list[tuple[str, int]], catalog: Catalog) -> dict[str, int]:
    """{canonical chip name: devices} for a list of (name, count)."""
    out: dict[str, int] = {}
    for name, count in chips:
        key = catalog.canonical(name)
        out[key] = out.get(key, 0) + count
    return out


class Throttle:
    """Stretches blocks of compute by `slowdown`; counts what the stretching cost."""

    def __init__(self, slowdown: float = 1.0) -> None:
        if slowdown < 1.0:
            raise ValueError(f"slowdown {slowdown} < 1: emulation only slows a rank down")
        self.slowdown = slowdown
        self.compute_s = 0.0
        """Real compute inside the blocks."""
        self.slept_s = 0.0
        """Sleep taken (asked + oversleep)."""
        self.oversleep_s = 0.0
        """Sleep beyond what was asked: the emulation's own overhead."""

    @contextmanager
    def block(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        self.compute_s += elapsed
        want = elapsed * (self.slowdown - 1.0)
        if want > 0:
            t0 = time.perf_counter()
            time.sleep(want)
            slept = time.perf_counter() - t0
            self.slept_s += slept
            self.oversleep_s += max(0.0, slept - want)

    def describe(self) -> str:
        return (
            f"emulated: host CPU throttled {self.slowdown:.2f}x by sleeping after each "
            "micro-batch (catalog dense bf16 peak ratio)"
        )
