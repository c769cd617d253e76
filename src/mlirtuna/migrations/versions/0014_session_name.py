"""session.name: a name to tell sessions apart (`session new --name`; `run` sets one)

Named 0014 (not 0013) so that it cannot clash with another branch's 0013; it follows the head
it was written on, 0010.

Revision ID: 0014
Revises: 0010
Create Date: 2026-12-03 16:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("name", sa.String(length=200), server_default="", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("name")
