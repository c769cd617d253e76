"""bundle.path dropped: a bundle row names no file; `in_store` tells a file bundle from one in
bundle_chunk (issue 23). The file is derived from the session's artifact store and the ids.
session.bundle_cap_mib: the most a session's bundle may unpack to (None: the default).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 19:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.add_column(sa.Column("in_store", sa.Boolean(), server_default="0", nullable=False))
    op.execute(
        sa.text("UPDATE bundle SET in_store = :yes WHERE path IS NOT NULL").bindparams(yes=True)
    )
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.drop_column("path")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bundle_cap_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("bundle_cap_mib")
    # The old code only asked whether `path` was NULL (it derived the file from the store), so
    # a file bundle gets a marker, not a path it would never read.
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.add_column(sa.Column("path", sa.String(length=700), nullable=True))
    op.execute(
        sa.text("UPDATE bundle SET path = 'store' WHERE in_store = :yes").bindparams(yes=True)
    )
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.drop_column("in_store")
