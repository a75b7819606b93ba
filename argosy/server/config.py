"""Config of `argosy server`: where it listens, where it stores, what runs the jobs."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from argosy.health.config import NodePolicyConfig
from argosy.scheduler.config import SchedulerConfig

DEFAULT_PORT = 8265


def default_home() -> Path:
    """`$ARGOSY_HOME`, else `~/.argosy`: admin token, default database, run directories."""
    return Path(os.environ.get("ARGOSY_HOME") or Path.home() / ".argosy").expanduser()


class ServerConfig(BaseModel):
    """Every knob of the control plane; the CLI flags of `argosy server` set the first ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 unless told otherwise."""
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    """TCP port of the REST API."""
    home: Path = Field(default_factory=default_home)
    """State directory: admin.token, the default SQLite file, run directories."""
    db_url: str | None = None
    """SQLAlchemy URL of the store; default: sqlite:///<home>/argosy.db."""
    executor: str = "local"
    """Executor that runs jobs: local (this machine) or ray (a Ray cluster)."""
    ray_address: str | None = None
    """Address of the Ray cluster for the ray executor (e.g. 127.0.0.1:6379)."""
    queues_file: Path | None = None
    """Queue tree YAML; without it one queue, `default`, owns every device."""
    policy: str = "argosy"
    """Scheduling policy (argosy, quota, fifo); hot spares are off on the server."""
    local_slots: int = Field(default=0, ge=0)
    """CPU slots of the local executor when no accelerator is found; 0 = CPU cores."""
    local_node_devices: int = Field(default=0, ge=0)
    """Local executor without accelerators: split the slots into nodes of this many
    (0: one node), so elastic jobs and tidal leases resize one node at a time."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """The scheduler's knobs (a compressed tidal day needs compressed resize and hold
    times: docs/tidal.md)."""
    warm_launcher: bool = True
    """Local executor: keep one `argosy` process warm (its imports done), so a job's
    `argosy launch` starts without them."""
    node_policy: NodePolicyConfig = Field(default_factory=NodePolicyConfig)
    """How health verdicts reported to the server cordon, quarantine and return nodes."""
    cycle_interval_s: float = Field(default=1.0, gt=0)
    """Longest wait between scheduler cycles; a submit or an exit wakes it sooner."""
    min_cycle_gap_s: float = Field(default=0.05, ge=0)
    """Shortest gap between cycles: a burst of submits is admitted in one cycle."""
    poll_interval_s: float = Field(default=0.2, gt=0)
    """How often running attempts are checked for their exit."""
    nodes_interval_s: float = Field(default=2.0, gt=0)
    """How often the executor's inventory is checked for lost and returning nodes."""

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'argosy.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"
