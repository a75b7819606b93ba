"""What the REST API answers: pydantic models that also make the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.server.service_spec import ServiceSpec
from argosy.server.spec import JobSpec

JobState = Literal["pending", "admitted", "running", "succeeded", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"admitted", "running"})


class Placement(BaseModel):
    """Where the current (or last) attempt runs: chip type and devices per node."""

    chip: str
    nodes: dict[str, int]


class Job(BaseModel):
    """A job as the API and `argosy job ID --json` show it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    queue: str
    state: JobState
    attempts: int
    created_at: str
    """ISO 8601, UTC."""
    started_at: str | None = None
    finished_at: str | None = None
    reason: str = ""
    """Why the job is in its state (a failure, a cancel, a requeue)."""
    exit_code: int | None = None
    placement: Placement | None = None
    spec: JobSpec
    summary: dict[str, Any] | None = None
    """The runtime's goodput summary (summary.json) of the last attempt."""


class JobPage(BaseModel):
    """One page of jobs, oldest first; pass `next_cursor` as `cursor` for the next."""

    items: list[Job]
    next_cursor: int | None = None


class Event(BaseModel):
    """One line of the event log."""

    seq: int
    job_id: str | None
    kind: str
    message: str
    created_at: str


class EventPage(BaseModel):
    items: list[Event]
    next_cursor: int | None = None


class QueueInfo(BaseModel):
    """A queue with its quota and use per chip type."""

    name: str
    parent: str | None
    leaf: bool
    weight: float
    guarantee: dict[str, int]
    nominal: dict[str, int]
    ceiling: dict[str, int]
    usage: dict[str, int]
    pending: int
    running: int


class NodeView(BaseModel):
    """A node of the executor's inventory."""

    name: str
    chip: str
    devices: int
    free: int
    cordoned: bool
    up: bool
    jobs: list[str]
    health: str = "healthy"
    """The node-record policy's state: healthy, repaired, cordoned or quarantined."""


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(default=None, min_length=1, max_length=100)
    """Queue the token may submit to and cancel in; omitted: an admin token."""
    name: str = Field(default="", max_length=100)
    """Free-form label."""


class TokenCreated(BaseModel):
    token: str
    """Shown once; only its hash is stored."""
    queue: str | None
    name: str


class Health(BaseModel):
    status: Literal["ok"]


class ErrorBody(BaseModel):
    detail: Any


ServiceState = Literal["pending", "starting", "running", "stopping", "deleted", "failed"]


class Replica(BaseModel):
    """One `argosy serve` process of a service."""

    index: int
    node: str | None = None
    state: str
    """starting (loading), ready (answers /health), exited; with a tidal forecast also
    pending (placed, waiting for training ranks to leave its device), yielding, asleep
    (its device lent), waking."""
    url: str | None = None
    """Base URL of its OpenAI-compatible API (`.../v1`)."""
    attempt: int
    restarts: int


class Service(BaseModel):
    """A service as the API and `argosy service ID --json` show it."""

    id: str
    name: str
    queue: str
    state: ServiceState
    created_at: str
    reason: str = ""
    replicas: list[Replica]
    endpoints: list[str]
    """URLs of the replicas that answer their health probe."""
    spec: ServiceSpec


class ServicePage(BaseModel):
    items: list[Service]
    next_cursor: int | None = None


HealthVerdict = Literal[
    "healthy", "not_applicable", "degraded", "failed", "straggler", "fault", "repair"
]


class HealthReportBody(BaseModel):
    """A verdict about a node: a health check's, the runtime's, or an operator's repair."""

    model_config = ConfigDict(extra="forbid")

    verdict: HealthVerdict
    detail: str = Field(default="", max_length=2000)
    """What was seen (e.g. the checks that failed)."""


class HealthEvidence(BaseModel):
    """One verdict reported about a node, and the state it left the node in."""

    kind: str
    detail: str
    state: str
    created_at: str


class NodeDetail(NodeView):
    """A node with its health record and the latest verdicts about it (oldest first)."""

    in_service: bool
    """Whether new work may be placed there (not cordoned, not lost, healthy enough)."""
    healthy_streak: int
    score: float
    """Weight of negative evidence within the policy's window."""
    history: list[HealthEvidence]
