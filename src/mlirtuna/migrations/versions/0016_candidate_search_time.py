"""candidate.search_time: the search pass's time of every candidate, kept when the top-k
re-measurement replaces kernel_time (quick lists learn from one kind of time: quick.collect)

Follows 0015 (bundle.path dropped). Rows recorded before it have no search time (NULL):
quick.collect reads their kernel_time, the mix it read before.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 19:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search_time", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("search_time")
