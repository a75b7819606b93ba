"""Config section of the runtime layer: watchdog thresholds, restart policy, grace periods."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RuntimeConfig(BaseModel):
    """How `argosy launch` watches ranks and recovers from faults."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_restarts: int = Field(3, ge=0)
    """Group restarts allowed before the launcher gives up and reports the cause."""
    warm_standby: bool = True
    """Keep one process per local rank with torch imported, ready for the next restart."""
    warm_cuda: bool = True
    """A standby also creates CUDA's context on its rank's device (seconds off a GPU
    restart; a few hundred MB of that device's memory held meanwhile: turn it off for a
    job that needs every byte)."""
    poll_interval_s: float = Field(0.05, gt=0)
    """How often the agent reads the progress board and checks the processes."""
    hang_floor_s: float = Field(5.0, gt=0)
    """Shortest stall that counts as a hang, whatever the step time."""
    hang_p99_factor: float = Field(10.0, gt=0)
    """A stall longer than this many recent p99 step times (and the floor) is a hang."""
    startup_timeout_s: float = Field(300.0, gt=0)
    """Seconds a rank may take from spawn to its first step before it counts as hung."""
    term_grace_s: float = Field(3.0, ge=0)
    """Seconds between SIGTERM and SIGKILL when stopping the group."""
    exit_timeout_s: float = Field(60.0, gt=0)
    """Seconds ranks may linger after all reported `finish()` before they are stopped."""
    stack_dump_wait_s: float = Field(0.5, ge=0)
    """Seconds given to ranks to write their Python stacks after a hang."""
    straggler_threshold: float = Field(1.5, gt=1)
    """A rank whose compute time is this many times the median of its peers is slow."""
    straggler_window: int = Field(20, ge=3)
    """Recent steps compared; the rank must be slow in most of them."""
    straggler_fraction: float = Field(0.8, gt=0, le=1)
    """Share of the window in which the rank must exceed the threshold to be confirmed."""
    straggler_confirm_s: float = Field(5.0, ge=0)
    """Seconds a rank must stay flagged before it is reported (filters bursts)."""
    straggler_policy: Literal["warn", "restart"] = "warn"
    """warn: report and keep going; restart: restart the group on a spare without it."""
    spares: int = Field(0, ge=0)
    """Spare device slots available to replace a confirmed straggler."""
    step_history: int = Field(200, ge=10)
    """Recent step times kept to compute the p99 used by the hang threshold."""
    store_probe_timeout_s: float = Field(30.0, gt=0)
    """Multi-node launches: seconds node rank 0 waits to see every node's probe file in the
    checkpoint store before it fails the launch (the store is not shared)."""
    energy_interval_s: float = Field(0.5, ge=0)
    """Seconds between the launcher's energy samples of the node's devices (NVML, RAPL;
    `energy.jsonl`, summary.json `energy`); 0 turns the meter off."""
    energy_log_interval_s: float = Field(5.0, gt=0)
    """Seconds between lines of `energy.jsonl` (each with the joules then and the peak
    watts since the previous line); goodput's intervals are read off it linearly between."""
