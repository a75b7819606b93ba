"""Node failures from the published fault model (../shared/reference/fault_model.json).

Failures arrive as a Poisson process at `fault_rate_per_device_hour` per device over the
fleet (Llama 3: 1.97e-5 unexpected interruptions per GPU-hour, a fleet figure that
already includes its lemon nodes). One rate: a share `lemon_fraction` of nodes draws
`lemon_factor` times the share of the others, and the weights are normalised so the
fleet still fails at exactly that rate; a replaced lemon takes the ordinary share (the
fleet rate then drops, as it does when lemons are culled). A fault is a hardware fault
(node down until repaired; Llama 3: 78%) or a transient one (the job restarts in
place). Rates are per node, weighted by its devices.
"""

from __future__ import annotations

import numpy as np

from argosy.scheduler.capacity import Capacity
from argosy.sim.config import SimConfig


class FaultModel:
    """Draws the next failure: when, and which node."""

    def __init__(self, cap: Capacity, cfg: SimConfig, seed: int) -> None:
        self.rng = np.random.default_rng(seed + 7919)
        self.cfg = cfg
        self.base = cap.cap.astype(float)
        self.weight = self.base.copy()
        lemons = self.rng.uniform(size=len(self.weight)) < cfg.lemon_fraction
        self.weight[lemons] *= cfg.lemon_factor
        scale = self.base.sum() / self.weight.sum()  # the fleet rate stays the rate
        self.base *= scale
        self.weight *= scale
        self._refresh()

    def _refresh(self) -> None:
        self.cum = np.cumsum(self.weight)
        self.rate_s = self.cum[-1] * self.cfg.fault_rate_per_device_hour / 3600.0

    def next_after(self, t: float) -> tuple[float, int]:
        if self.rate_s <= 0:
            return float("inf"), 0
        when = t + self.rng.exponential(1.0 / self.rate_s)
        node = int(np.searchsorted(self.cum, self.rng.uniform(0, self.cum[-1])))
        return when, node

    def is_hardware(self) -> bool:
        return bool(self.rng.uniform() < self.cfg.hardware_share)

    def replaced(self, node: int) -> None:
        """A replaced node fails at the ordinary rate."""
        self.weight[node] = self.base[node]
        self._refresh()
