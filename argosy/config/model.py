"""The root of the config tree. Each layer owns its section in its own `config.py`."""

from pydantic import BaseModel, ConfigDict, Field

from argosy.hardware.config import HardwareConfig
from argosy.planner.config import PlannerConfig
from argosy.runtime.config import RuntimeConfig


class PlatformConfig(BaseModel):
    """Every knob of argosy, one section per layer."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    """Chip catalog and default cluster."""
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    """Defaults of argosy plan and argosy estimate."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Launcher: hang and straggler thresholds, restart policy."""
