"""Config section of the resource layer."""

from pydantic import BaseModel, ConfigDict


class HardwareConfig(BaseModel):
    """Which cluster commands use when none is given."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    default_cluster: str = "h100:64"
    """Cluster shorthand or YAML path used when a command is given no --cluster."""
    catalog_path: str | None = None
    """A chip catalog YAML to use instead of the built-in one."""
