"""session.standin: the session was tuned on mlirtuna's stand-in rocMLIR build (made-up numbers),
told by the build itself when the session was opened. Such a session is never picked by
`export --arch`, compare's defaults, `--reuse`, `--skip-tuned` or `quick-list` unless named.

Sessions opened before it are real as far as the database knows (false); `db` cannot tell a
stand-in session of an older release apart (its commit was the stand-in's 0123456789abcdef…,
which `session list` shows).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 05:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("standin", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("standin")
