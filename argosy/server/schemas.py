"""What the REST API answers: pydantic models that also make the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from argosy.server.service_spec import ServiceSpec
from argosy.server.spec import JobSpec

JobState = Literal["pending", "admitted", "running", "succeeded", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"admitted", "running"})
SERVICE_TERMINAL: frozenset[str] = frozenset({"deleted", "failed"})


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
    error: str | None = None
    """A failed job's telling line of its launcher's output, whole (`reason` keeps of a
    rank's output only an exception's class): for the job's queue and the admins, in
    `GET /jobs/{id}`; null elsewhere."""
    waiting: str | None = None
    """Why a pending job waits (its queue's quota, devices held by others, nodes out of
    placement: cordoned, lost or unhealthy), as the console's queues page says it; in
    `GET /jobs/{id}` only, null elsewhere."""


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
    actor: str = "system"
    """Who caused it: `admin`, `token <id> (<name>)`, or `system` (the control loop)."""


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
    """Devices new work may take now (0 on a node out of service: cordoned, lost or
    unhealthy)."""
    used: int
    """Devices held by jobs and service replicas, also on a cordoned or lost node (what
    runs there keeps running)."""
    cordoned: bool
    up: bool
    lost_at: float | None = None
    """When the server saw the node lost (Unix seconds); None while it is up."""
    jobs: list[str]
    health: str = "healthy"
    """The node-record policy's state: healthy, repaired, cordoned or quarantined."""


MAX_TOKEN_LIFETIME_S = 10 * 366 * 86_400.0
"""The longest expiry a token may be given (about ten years)."""
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def duration_s(text: str) -> float:
    """`30d`, `12h`, `90m`, `45s`, `2w` in seconds."""
    return float(int(text[:-1]) * DURATION_UNITS_S[text[-1]])


class TokenRequest(BaseModel):
    """A new token: admin (no queue) or scoped to one leaf queue, with an optional
    expiry (`expires_in_s` or `expires`, not both; none: it never expires)."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(default=None, min_length=1, max_length=100)
    """Queue the token may submit to and cancel in; omitted: an admin token."""
    name: str = Field(default="", max_length=100, pattern=r"^[^\x00-\x1f\x7f]*$")
    """Free-form label (no control characters); events name the token by id and name."""
    expires_in_s: float | None = Field(
        default=None, gt=0, le=MAX_TOKEN_LIFETIME_S, strict=True, allow_inf_nan=False
    )
    """Seconds from now until the token stops working."""
    expires: str | None = Field(default=None, max_length=12, pattern=r"^[1-9][0-9]{0,8}[smhdw]$")
    """The same as a duration: a whole number and a unit s, m, h, d or w (`30d`)."""

    @field_validator("expires")
    @classmethod
    def _bounded(cls, value: str | None) -> str | None:
        if value is not None and duration_s(value) > MAX_TOKEN_LIFETIME_S:
            raise ValueError(f"at most {MAX_TOKEN_LIFETIME_S / 86_400:.0f}d")
        return value

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenRequest:
        if self.expires is not None and self.expires_in_s is not None:
            raise ValueError("give expires or expires_in_s, not both")
        return self

    def lifetime_s(self) -> float | None:
        """Seconds until expiry; None: never."""
        return duration_s(self.expires) if self.expires is not None else self.expires_in_s


class TokenCreated(BaseModel):
    """A new token: the secret is in `token`, shown once; only a salted hash is kept."""

    token: str
    """Shown once; only a salted hash of it is stored."""
    id: str
    """Public id: `argosy token list` shows it, events name it, `revoke` takes it."""
    queue: str | None
    name: str
    expires_at: str | None = None
    """ISO 8601, UTC; None: never."""


class TokenInfo(BaseModel):
    """A token as `argosy token list` shows it: never its secret or hash."""

    id: str
    name: str
    queue: str | None
    """None: an admin token."""
    state: Literal["active", "expired", "revoked"]
    created_at: str
    expires_at: str | None = None
    revoked_at: str | None = None
    created_by: str
    """The actor that created it (`server`: the server's own admin.token)."""


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
    failed_probes: int = 0
    """Health probes it failed in a row just now (the third restarts a ready replica)."""


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
