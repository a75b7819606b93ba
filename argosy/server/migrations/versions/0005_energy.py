"""Energy: one row per attempt of a job and node, with the joules its launcher metered.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "energy",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("total_j", sa.Float),
        sa.Column("productive_j", sa.Float),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_energy_job", "energy", ["job_id"])
    op.create_index("ix_energy_node", "energy", ["node"])
    op.create_index("ix_energy_ended", "energy", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_energy_ended", "energy")
    op.drop_index("ix_energy_node", "energy")
    op.drop_index("ix_energy_job", "energy")
    op.drop_table("energy")
