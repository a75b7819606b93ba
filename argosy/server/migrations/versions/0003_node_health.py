"""Node health: each node's policy record, and the evidence reported about it.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_health",
        sa.Column("node", sa.String(200), primary_key=True),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "node_evidence",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_node_evidence_node", "node_evidence", ["node", "seq"])


def downgrade() -> None:
    op.drop_index("ix_node_evidence_node", "node_evidence")
    op.drop_table("node_evidence")
    op.drop_table("node_health")
