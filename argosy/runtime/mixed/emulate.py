"""Chip emulation: give CPU ranks chip identities and a compute time set by their chip.

EMULATION, not a measurement of the chips. Every rank computes on the host CPU; the time
a block of work takes is then *set*, not measured: a block of `samples` sequences lasts
`samples x sample_s` from its emulated start, where `sample_s` is this rank's emulated
seconds per sequence. The rank runs the real compute and then sleeps until that deadline
(`Throttle`). So a rank's busy time per sample follows the chip catalog's speed ratio
whatever the host's load does to the real compute, as long as the real compute fits
inside the deadline; when it does not, the excess is counted as the emulation's overrun
(its own overhead, reported per step) and later blocks of the same step catch up.

Where `sample_s` comes from (`sample_seconds`):
- relative speed of each chip: its dense bf16 peak (catalog `bf16_tflops`) over the
  fastest chip's of the launch (`speed_source="peak"`, the default), or the planner's
  per-device rate for the chip's group over the fastest group's (`"plan"`: chips run as
  fast as the cost model believes, which isolates the runtime's losses from the cost
  model's disagreement with the peak ratio);
- reference time: the fastest chip's seconds per sample, either given
  (`ARGOSY_EMULATE_SAMPLE_S`, so that several launches share one time scale) or
  calibrated once at start-up: every rank times a few real micro-batches, the ranks
  agree on the largest median (all-reduce max), and HEADROOM (3) times it leaves room
  for co-tenant load so the real compute fits inside the deadline.

Inside a block, `pace(fraction)` holds a caller until the point of the block at which
that fraction of the backward pass would be done (forward = the first third of the
block), so gradient buckets leave when an emulated chip would produce them, not when
the fast host CPU did. Memory, links and MFU differences between chips are not
emulated. Each report that carries emulated figures says so.

    speeds = relative_speeds([("h100", 1), ("a100-80g", 2)], catalog)   # per rank
    throttle = Throttle(sample_s=ref_s / speeds[rank].relative_speed)
    with throttle.step():
        with throttle.block(samples=4):
            loss = model(x, y)           # real compute; the sleep to the deadline follows
    throttle.overrun_s                   # time past the deadlines: the emulation's overhead
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from argosy.core.clock import Clock, SystemClock
from argosy.hardware.catalog import Catalog

HEADROOM = 3.0
"""Calibrated reference = HEADROOM x the slowest rank's median real time per sample."""
FORWARD_SHARE = 1.0 / 3.0
"""Share of a block spent in forward (backward costs about twice the forward)."""
ENV_EMULATE = "ARGOSY_EMULATE_CHIPS"
"""The --emulate-chips spec as the ranks see it."""
SPEED_SOURCES = ("peak", "plan")


@dataclass(frozen=True)
class EmulatedChip:
    """The chip a rank plays and its speed relative to the fastest chip of the launch."""

    chip: str
    peak_tflops: float
    relative_speed: float
    """This chip's speed / the fastest chip's (0 < s <= 1)."""


def relative_speeds(chips: list[tuple[str, int]], catalog: Catalog) -> list[EmulatedChip]:
    """One entry per rank, in the order of `chips`, speeds from the catalog's bf16 peaks."""
    resolved = [(catalog.get(name), count) for name, count in chips]
    fastest = max(chip.peak_tflops("bf16") for chip, _ in resolved)
    out: list[EmulatedChip] = []
    for chip, count in resolved:
        peak = chip.peak_tflops("bf16")
        out += [EmulatedChip(chip.id, peak, peak / fastest)] * count
    return out


def canonical_counts(chips: list[tuple[str, int]], catalog: Catalog) -> dict[str, int]:
    """{canonical chip name: devices} for a list of (name, count)."""
    out: dict[str, int] = {}
    for name, count in chips:
        key = catalog.canonical(name)
        out[key] = out.get(key, 0) + count
    return out


def parse_sample_seconds(text: str) -> dict[str, float]:
    """'h100-sxm=0.006,a100-80g=0.019' -> {chip: seconds per sample} (all > 0)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        chip, _, value = part.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not chip or seconds <= 0:
            raise ValueError(f"'{part}': expected CHIP=SECONDS with SECONDS > 0")
        out[chip.strip()] = seconds
    if not out:
        raise ValueError("empty; expected CHIP=SECONDS,...")
    return out


def sample_seconds(reference_s: float, chips: list[str], speeds: list[float]) -> dict[str, float]:
    """{chip: emulated seconds per sample}: the fastest chip's `reference_s` / speed."""
    return {chip: reference_s / speed for chip, speed in zip(chips, speeds, strict=True)}


class Throttle:
    """Sets the duration of blocks of work: `samples x sample_s` each, deadline-based.

    `clock` and `sleep` are the host's monotonic clock and `time.sleep` unless given (a
    test passes a FakeClock and its `advance`)."""

    def __init__(
        self,
        sample_s: float = 0.0,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._now = (clock or SystemClock()).now_s
        self._sleep = sleep
        if sample_s < 0:
            raise ValueError(f"sample_s {sample_s} < 0: a block cannot take negative time")
        self.sample_s = sample_s
        """Emulated seconds per sample (0: no emulation, blocks take their real time)."""
        self.compute_s = 0.0
        """Wall time of the blocks' real compute (before their sleep)."""
        self.emulated_s = 0.0
        """Time the blocks were set to take: samples x sample_s, summed."""
        self.overrun_s = 0.0
        """Time past the deadlines, at the end of each step (or block outside a step): the
        real compute did not fit, or a sleep overshot. The emulation's own overhead."""
        self._in_step = False
        self._deadline: float | None = None
        self._block: tuple[float, float] | None = None

    @contextmanager
    def step(self) -> Iterator[None]:
        """The blocks inside follow one another on one emulated timeline (an overrun of
        one block is caught up by the next); the overrun left at the end is counted."""
        self._in_step, self._deadline = True, None
        try:
            yield
        finally:
            self._in_step = False
            if self._deadline is not None:
                self.overrun_s += max(0.0, self._now() - self._deadline)
            self._deadline = None

    @contextmanager
    def block(self, samples: float) -> Iterator[None]:
        """Real compute inside, then sleep until start + samples x sample_s."""
        now = self._now()
        start = self._deadline if self._in_step and self._deadline is not None else now
        deadline = start + samples * self.sample_s
        self._block, self._deadline = (start, deadline), deadline
        self.emulated_s += samples * self.sample_s
        try:
            yield
        finally:
            self.compute_s += self._now() - now
            self._block = None
        if self.sample_s > 0:
            self._sleep_until(deadline)
        if not self._in_step:
            self.overrun_s += max(0.0, self._now() - deadline)
            self._deadline = None

    def pace(self, backward_fraction: float) -> None:
        """Inside a block: wait until `backward_fraction` of its backward would be done."""
        if self._block is None or self.sample_s <= 0:
            return
        start, end = self._block
        share = FORWARD_SHARE + (1.0 - FORWARD_SHARE) * min(max(backward_fraction, 0.0), 1.0)
        self._sleep_until(start + share * (end - start))

    def _sleep_until(self, deadline: float) -> None:
        left = deadline - self._now()
        if left > 0:
            self._sleep(left)
