"""Chip emulation: give CPU ranks chip identities and throttle them to their chip's speed.

EMULATION, not a measurement of the chips: every rank computes on the host CPU and, after
each throttled block, sleeps the block's wall time x (slowdown - 1), where slowdown =
HEADROOM x (fastest peak of the launch / its chip's dense bf16 peak, catalog
`bf16_tflops`). So a rank playing an A100 (312 TFLOPs) beside an H100 (989) takes 3.17x as
long per micro-batch as the H100 rank. HEADROOM (4) slows every rank, the fastest too, by
the same factor, so that every rank leaves the CPU idle part of the time: three ranks on
two shared cores otherwise slow the unthrottled rank by contention more than the others
(the OS scheduler favours tasks that sleep), which skews the ratios (benchmarks/mixed.py
at load 16 on 2 cores: efficiency 64-80% with headroom 2, 83% with 4). The sleep after a
block is shortened by earlier oversleep. (Stretching to thread CPU time x slowdown instead
was tried: under a load average of 20 on 2 cores, blocks outlasted that target by 260 ms
per step and the ratios broke worse.) Nothing else (memory, links, MFU differences between
chips) is emulated. Each report that carries emulated figures says so (`describe()`).

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

HEADROOM = 4.0
"""Common slowdown of every emulated rank (see the module docstring)."""
ENV_EMULATE = "ARGOSY_EMULATE_CHIPS"
"""The --emulate-chips spec as the ranks see it."""


@dataclass(frozen=True)
class EmulatedChip:
    """The chip a rank plays and how much slower than the fastest chip of the launch."""

    chip: str
    peak_tflops: float
    slowdown: float
    """headroom x fastest peak / this chip's peak (>= 1)."""


def emulated_speeds(
    chips: list[tuple[str, int]], catalog: Catalog, headroom: float = HEADROOM
) -> list[EmulatedChip]:
    """One entry per rank, in the order of `chips` (names resolved by the catalog)."""
    resolved = [(catalog.get(name), count) for name, count in chips]
    fastest = max(chip.peak_tflops("bf16") for chip, _ in resolved)
    out: list[EmulatedChip] = []
    for chip, count in resolved:
        peak = chip.peak_tflops("bf16")
        out += [EmulatedChip(chip.id, peak, headroom * fastest / peak)] * count
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
        """Wall time of the blocks' real compute."""
        self.cpu_s = 0.0
        """Thread CPU time of the blocks (wall / cpu says how much co-tenants took)."""
        self.slept_s = 0.0
        """Sleep taken (asked + oversleep)."""
        self.asked_s = 0.0
        """Sleep the emulation asked for: wall x (slowdown - 1), per block."""
        self.oversleep_s = 0.0
        """Sleep taken beyond what was asked, in total: the emulation's own overhead. The
        sleep after a block is shortened by the previous blocks' oversleep, so this stays
        about one sleep's overshoot instead of growing with every block."""
        self._debt_s = 0.0

    @contextmanager
    def block(self) -> Iterator[None]:
        """The block lasts its wall time x slowdown in all (compute, then sleep)."""
        wall_start, cpu_start = time.perf_counter(), time.thread_time()
        yield
        wall = time.perf_counter() - wall_start
        self.compute_s += wall
        self.cpu_s += time.thread_time() - cpu_start
        want = wall * (self.slowdown - 1.0)
        self.asked_s += want
        ask = want - self._debt_s  # sleep already taken beyond an earlier ask counts here
        if ask <= 0:
            self._debt_s = -ask
            return
        t0 = time.perf_counter()
        time.sleep(ask)
        slept = time.perf_counter() - t0
        self.slept_s += slept
        self._debt_s = max(0.0, slept - ask)
        self.oversleep_s = max(0.0, self.slept_s - self.asked_s)

    def describe(self) -> str:
        return (
            f"emulated: host CPU throttled {self.slowdown:.2f}x by sleeping after each "
            f"micro-batch (catalog dense bf16 peak ratio x headroom {HEADROOM:g})"
        )
