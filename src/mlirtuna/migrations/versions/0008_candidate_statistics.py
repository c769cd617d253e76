"""candidate statistics, winner margin, session top-k

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 06:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("time_min", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("time_iqr", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("samples", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("remeasured", sa.Boolean(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("winner_margin", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("winner_noise", sa.Double(), nullable=True))
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("topk", sa.Integer(), server_default="3", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("topk")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("winner_noise")
        batch_op.drop_column("winner_margin")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("remeasured")
        batch_op.drop_column("samples")
        batch_op.drop_column("time_iqr")
        batch_op.drop_column("time_min")
