"""The root of the config tree. Each layer owns its section in its own `config.py`."""

from pydantic import BaseModel, ConfigDict, Field

from argosy.checkpoint.config import CheckpointConfig
from argosy.hardware.config import HardwareConfig
from argosy.health.config import HealthConfig
from argosy.planner.config import PlannerConfig
from argosy.runtime.config import RuntimeConfig
from argosy.scheduler.config import SchedulerConfig
from argosy.sim.config import SimConfig


class PlatformConfig(BaseModel):
    """Every knob of argosy, one section per layer."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    """Chip catalog and default cluster."""
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    """Defaults of argosy plan and argosy estimate."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Launcher: hang and straggler thresholds, restart policy."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Scheduler: preemption limits, elastic resizing, tidal forecast, hot spares."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Flash checkpoint: directory, steps kept, shared-memory slots."""
    health: HealthConfig = Field(default_factory=HealthConfig)
    """Node health checks: probe sizes, expectations, verdict thresholds, node-record policy."""
    sim: SimConfig = Field(default_factory=SimConfig)
    """Simulator: fault model, cycle pacing, assumed factors of the five-factor report."""
