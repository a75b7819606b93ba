"""Initial schema: jobs, events, tokens, nodes.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("placement", sa.JSON),
        sa.Column("summary", sa.JSON),
        sa.Column("stop_requested", sa.String(16)),
        sa.Column("idempotency_key", sa.String(200), unique=True),
        sa.Column("request_hash", sa.String(64)),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_queue_state", "jobs", ["queue", "state"])
    op.create_table(
        "events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_events_job", "events", ["job_id"])
    op.create_table(
        "tokens",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("queue", sa.String(100)),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("cordoned", sa.Boolean, nullable=False),
    )


def downgrade() -> None:
    for table in ("nodes", "tokens", "events", "jobs"):
        op.drop_table(table)
