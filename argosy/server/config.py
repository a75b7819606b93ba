"""Config of `argosy server`: where it listens, where it stores, what runs the jobs."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from argosy.core import bounded_http
from argosy.core.net import DEFAULT_PORT
from argosy.executors.limits import JobLimitsConfig
from argosy.health.config import NodePolicyConfig
from argosy.scheduler.config import SchedulerConfig


class HttpLimits(BaseModel):
    """How the server's HTTP listener bounds each connection (`argosy.core.bounded_http`):
    what a client that floods, trickles or hangs can hold."""

    model_config = ConfigDict(extra="forbid")

    max_head_bytes: int = Field(default=bounded_http.MAX_HEAD_BYTES, ge=4096, le=1 << 20)
    """A request's line and headers together (431 beyond it)."""
    head_timeout_s: float = Field(default=bounded_http.HEAD_TIMEOUT_S, gt=0, le=600)
    """Time for a request's head to arrive, from the connection or the last response."""
    body_timeout_s: float = Field(default=bounded_http.BODY_TIMEOUT_S, gt=0, le=3600)
    """Time a body may take at least; longer ones must keep `min_body_bytes_per_s`."""
    min_body_bytes_per_s: int = Field(default=bounded_http.MIN_BODY_BYTES_PER_S, ge=0)
    """The slowest a long body may arrive (a trickle past it is cut off)."""
    keep_alive_s: int = Field(default=bounded_http.KEEP_ALIVE_S, ge=0, le=3600)
    """How long an idle keep-alive connection stays open."""
    limit_concurrency: int = Field(default=bounded_http.LIMIT_CONCURRENCY, ge=16)
    """Connections and requests at once (503 past it); lowered to what the open-files
    limit allows."""
    max_per_client: int = Field(default=bounded_http.MAX_PER_CLIENT, ge=0)
    """Connections one client address may hold open (503 past it; 0: no cap), so one
    client cannot take every connection."""

    def bounds(self) -> bounded_http.HttpBounds:
        return bounded_http.HttpBounds(**self.model_dump())


def default_home() -> Path:
    """`$ARGOSY_HOME`, else `/var/lib/argosy` for root, else `~/.argosy`: admin token,
    default database, run directories (`argosy.core.home`)."""
    from argosy.core.home import default_home as home

    return home()


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
    ray_head_uids: list[int] = Field(default_factory=list)
    """Users, besides root and the server's own, whose process may hold the Ray head's
    port when the head runs on this host (a head started as a dedicated user): a port
    held by anyone else is refused before Ray's token is sent to it."""
    ray_suspect_s: float = Field(default=15.0, ge=0)
    """Seconds a Ray node whose attempt's actor died stays out of placement (unless Ray
    declares it dead first, or it rejoins under a new node id)."""
    queues_file: Path | None = None
    """Queue tree YAML; without it one queue, `default`, owns every device."""
    policy: str = "argosy"
    """Scheduling policy (argosy, quota, fifo); hot spares are off on the server."""
    local_slots: int = Field(default=0, ge=0)
    """CPU slots of the local executor when no accelerator is found; 0 = CPU cores."""
    local_node_devices: int = Field(default=0, ge=0)
    """Local executor: split its CPU slots, or each chip type's accelerators, into nodes of
    this many (0: one node), so elastic jobs and tidal leases resize one node at a time
    (a job's `nproc_per_node` must then fit one such node)."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """The scheduler's knobs (a compressed tidal day needs compressed resize and hold
    times: docs/tidal.md)."""
    runs_root: Path | None = None
    """Where run directories live; default `<home>/runs`. A root server whose job users
    cannot reach `<home>/runs` (a home under a 0700 directory) uses
    `/var/lib/argosy/runs-<hash of home>` instead, and says so at start."""
    run_as: str | None = None
    """Local executor, server running as root: the unprivileged user jobs run as (created
    when missing); None: `argosy-job`. Ignored when the server is not root (jobs then run
    as the server's user and can read what it can: docs/server.md, Isolation)."""
    run_as_per_queue: bool = True
    """One user per queue (`<run_as>-<queue>`), so one tenant's jobs cannot read another's
    files or processes."""
    allow_root_jobs: bool = False
    """Let a root server run jobs as root (no isolation at all); off by default."""
    job_env_allow: list[str] = Field(default_factory=list, max_length=100)
    """More environment names (fnmatch patterns) jobs inherit from the server, besides
    the allow-list (paths, locale, threading and vendor runtime knobs). Names that look
    like secrets (TOKEN, SECRET, PASSWORD, KEY, AUTH, ...) are never passed on."""
    warm_launcher: bool = True
    """Local executor: keep one `argosy` process warm (its imports done), so a job's
    `argosy launch` starts without them."""
    job_limits: JobLimitsConfig = Field(default_factory=JobLimitsConfig)
    """Local executor: what each attempt may use of the machine (memory, CPU time and
    tasks from its devices' share, cgroup v2; rlimits of job users' processes) and
    whether a job user's files in /dev/shm and /tmp and its SysV IPC objects go when
    its last attempt there ends (docs/server.md, Isolation)."""
    pue: float | None = Field(default=None, ge=1.0, le=5.0)
    """The facility's power usage effectiveness (facility energy / IT energy), a figure
    from the data-centre operator: the energy factor is productive IT energy / (IT energy x
    pue). Shown as configured, never measured; None: the factor is over IT energy only."""
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
    session_ttl_s: float = Field(default=12 * 3600.0, gt=0)
    """Lifetime of a console login session; after it the browser logs in again."""
    max_pending_jobs_per_queue: int = Field(default=5000, ge=0)
    """Jobs one queue may have waiting to start (0: no limit); a submit beyond it is a
    429, so one tenant cannot grow the store and the scheduler's queue without bound
    (Slurm's MaxSubmitJobs). An Idempotency-Key already used still answers its job."""
    max_services_per_queue: int = Field(default=200, ge=0)
    """Services one queue may hold (not yet deleted or ended; 0: no limit); a create past
    it is a 429 naming the limit."""
    token_writes_per_s: float = Field(default=20.0, ge=0)
    """Changes (POST, PUT, PATCH, DELETE) one token may make per second, sustained, through
    the API or the console (0: no limit; the server's own admin token is never limited):
    past it and its burst, a 429 with Retry-After. Every submit and cancel writes rows
    and events, so a tenant looping over them would grow the store without end."""
    token_write_burst: int = Field(default=1000, ge=1)
    """Changes a token may make at once, before the sustained rate applies (a sweep of
    1,000 jobs is submitted without waiting)."""
    http: HttpLimits = Field(default_factory=HttpLimits)
    """The HTTP listener's bounds per connection (head size and time, body rate,
    keep-alive, concurrency)."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest request body the server reads (413 beyond it); simulator report uploads
    have their own, larger cap (docs/server.md, Limits)."""
    access_log_max_bytes: int = Field(default=10 << 20, ge=1024)
    """Size at which `<home>/logs/access.log` is rotated (one line per HTTP request)."""
    access_log_backups: int = Field(default=3, ge=1, le=100)
    """Rotated access logs kept (`access.log.1` ... `.N`); older ones are deleted."""
    keep_finished_per_queue: int = Field(default=10_000, ge=0)
    """Finished jobs (and ended services) the store keeps per queue, the newest by end
    (0: all). Older ones are removed with their events, so a tenant that loops over submit
    and cancel cannot grow the store without end. One that held devices is removed only
    once it ended `PAST_USE_HALF_LIVES` usage half-lives ago: the queues' fair-share
    use is rebuilt from what held devices."""
    keep_finished_days: float = Field(default=0.0, ge=0)
    """Finished jobs and ended services older than this are removed too (0: kept)."""
    prune_run_dirs: bool = False
    """Also remove a removed job's run directory (its logs and checkpoints); by default
    it stays under `runs_dir`, for you to archive."""

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'argosy.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.runs_root or self.home / "runs"
