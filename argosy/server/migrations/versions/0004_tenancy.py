"""Tenancy: token ids, salts, expiry and revocation; console sessions; an actor on
every event.

Tokens made before this revision keep their unsalted SHA-256 `hash` (salt '') until
their first use, when the store hashes them again with a salt of their own. Events
written before it are marked as the system's.

Revision ID: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("id", sa.String(32)))
        batch.add_column(sa.Column("salt", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("expires_at", sa.Float))
        batch.add_column(sa.Column("revoked_at", sa.Float))
        batch.add_column(sa.Column("created_by", sa.String(200), nullable=False, server_default=""))
    op.execute("UPDATE tokens SET id = 't' || substr(hash, 1, 12) WHERE id IS NULL")
    op.create_index("ix_tokens_id", "tokens", ["id"], unique=True)
    op.create_table(
        "sessions",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_sessions_token", "sessions", ["token_id"])
    with op.batch_alter_table("events") as batch:
        batch.add_column(
            sa.Column("actor", sa.String(200), nullable=False, server_default="system")
        )


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("actor")
    op.drop_index("ix_sessions_token", "sessions")
    op.drop_table("sessions")
    op.drop_index("ix_tokens_id", "tokens")
    with op.batch_alter_table("tokens") as batch:
        for column in ("created_by", "revoked_at", "expires_at", "salt", "id"):
            batch.drop_column(column)
