"""Config section of the simulator: fault model, cycle pacing and assumed factors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BudgetConfig(BaseModel):
    """Seconds a job stands still per fault, besides its rework since the checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    detection_s: float = Field(ge=0)
    """From the fault to the runtime noticing it."""
    restart_s: float = Field(ge=0)
    """Tearing down and relaunching the processes."""
    reload_s: float = Field(ge=0)
    """Loading the checkpoint back."""


def _budgets() -> dict[str, BudgetConfig]:
    stock = BudgetConfig(detection_s=600.0, restart_s=600.0, reload_s=300.0)
    fast = BudgetConfig(detection_s=30.0, restart_s=120.0, reload_s=60.0)
    return {"fifo": stock, "quota": stock, "argosy": fast}


class SimConfig(BaseModel):
    """How the simulator injects faults and paces the scheduler."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    faults: bool = True
    """Inject node failures from the published fault model."""
    fault_rate_per_device_hour: float = Field(default=1.97e-5, ge=0)
    """Unexpected interruptions per device-hour over the whole fleet, lemon nodes included
    (Llama 3: 419 / (16,384 x 54 x 24)); the one fault rate of the simulation."""
    hardware_share: float = Field(default=0.78, ge=0, le=1)
    """Share of faults that take the node down (Llama 3: 78% hardware)."""
    repair_s: float = Field(default=12 * 3600.0, gt=0)
    """Hours a failed node stays down before repair (assumption)."""
    lemon_fraction: float = Field(default=0.01, ge=0, le=1)
    """Share of nodes that fail far more often (lemon nodes, Kokolis et al.; assumption)."""
    lemon_factor: float = Field(default=20.0, ge=1)
    """How many times more often a lemon node fails than the others (assumption); it
    redistributes the fleet rate over nodes, it does not add to it."""
    quarantine_replace_s: float = Field(default=48 * 3600.0, gt=0)
    """A quarantined node is replaced by a healthy one after this long (assumption)."""
    runtime_budgets: dict[str, BudgetConfig] = Field(default_factory=_budgets)
    """Recovery budget per policy: a stock PyTorch job waits out the NCCL timeout (600 s)
    and reloads from disk; argosy's runtime detects in tens of seconds and reloads from
    memory (fault_model.json `time_costs`). Policies not listed use their own default."""
    cycle_interval_s: float = Field(default=5.0, ge=0)
    """Least virtual seconds between two scheduling cycles (events in between batch up)."""
    tick_s: float = Field(default=600.0, gt=0)
    """Period of inference load steps, SLO checks and allocation samples."""
    check_invariants: bool = False
    """Check the scheduler's invariants after every cycle and fault, stopping at the first
    broken one (slow; for tests and debugging)."""
    pue: float = Field(default=1.2, ge=1)
    """Facility PUE for the energy factor (assumed; not simulated)."""
    idle_power_fraction: float = Field(default=0.1, ge=0, le=1)
    """Share of its board power (`tdp_w`) an unallocated device draws (assumption: an
    idle H100 SXM draws about 70 W of its 700 W); `argosy.sim.energy`."""
    plans: Literal["planner", "stock"] = "planner"
    """Which parallel plans jobs run: `planner`: argosy runs the planner's plan for the
    chips it placed a job on and the baselines the framework's stock plan; `stock`: every
    policy runs stock plans (the scheduler's own share of the lead)."""
    estimate_error: float = Field(default=0.083, ge=0)
    """Median relative error of the run-time estimates a policy with reservations gets
    (the planner's step-time error on published runs it was not fitted on, 8.3%); each
    job's estimate is off by one lognormal factor (`argosy.sim.estimates`)."""
    serving_mfu: float = Field(default=0.25, gt=0, le=1)
    """MFU of an inference replica serving the load it is needed for (assumption: the
    training cost model does not price serving; the same for every policy)."""
