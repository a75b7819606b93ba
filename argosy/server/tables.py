"""The store's schema (SQLAlchemy Core). Alembic migrations in `migrations/` create and
change it; this module is what the code reads and writes through."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("name", String(100), nullable=False),
    Column("queue", String(100), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("spec", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("reason", Text, nullable=False, default=""),
    Column("exit_code", Integer),
    Column("placement", JSON),
    Column("summary", JSON),
    Column("stop_requested", String(16)),
    Column("idempotency_key", String(200), unique=True),
    Column("request_hash", String(64)),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_queue_state", "queue", "state"),
)

events = Table(
    "events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32)),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("actor", String(200), nullable=False, default="system"),
    Index("ix_events_job", "job_id"),
)

tokens = Table(
    "tokens",
    metadata,
    # SHA-256 of salt + secret (salt '': a token made before salts, hashed again on use)
    Column("hash", String(64), primary_key=True),
    Column("queue", String(100)),
    Column("name", String(100), nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    # public id (`argosy token list`, `revoke ID`, the actor of events)
    Column("id", String(32), unique=True),
    Column("salt", String(64), nullable=False, default=""),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("created_by", String(200), nullable=False, default=""),
)

sessions = Table(
    "sessions",
    metadata,
    # SHA-256 of the session id the console's cookie holds (never the API token)
    Column("hash", String(64), primary_key=True),
    Column("token_id", String(32), nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Index("ix_sessions_token", "token_id"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("cordoned", Boolean, nullable=False, default=False),
    # what the executor last listed there (None: a row kept only for its cordon)
    Column("chip", String(100)),
    Column("devices", Integer),
    Column("address", String(200)),
    Column("lost_at", Float),  # wall seconds since the node is lost; None: it is not
)

services = Table(
    "services",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("name", String(100), nullable=False),
    Column("queue", String(100), nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("replicas", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("stop_requested", String(16)),
    Index("ix_services_state", "state"),
)

node_health = Table(
    "node_health",
    metadata,
    Column("node", String(200), primary_key=True),
    Column("record", JSON, nullable=False),
    Column("updated_at", Float, nullable=False),
)

node_evidence = Table(
    "node_evidence",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("node", String(200), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("detail", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_node_evidence_node", "node", "seq"),
)

energy = Table(
    "energy",
    metadata,
    # one row per attempt of a job and node it ran on (argosy.server.energy)
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("node", String(200), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=False),
    Column("total_j", Float),  # None: no meter read on that node
    Column("productive_j", Float),
    Column("detail", Text, nullable=False, default=""),
    Index("ix_energy_job", "job_id"),
    Index("ix_energy_node", "node"),
    Index("ix_energy_ended", "ended_at"),
)
