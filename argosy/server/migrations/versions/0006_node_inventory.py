"""Node inventory: what each node the server has seen holds, and since when it is lost,
so a node that is down across a server restart is still listed (lost), not forgotten.

Revision ID: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("chip", sa.String(100)))
        batch.add_column(sa.Column("devices", sa.Integer))
        batch.add_column(sa.Column("address", sa.String(200)))
        batch.add_column(sa.Column("lost_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("lost_at")
        batch.drop_column("address")
        batch.drop_column("devices")
        batch.drop_column("chip")
