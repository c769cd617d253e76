"""session.capabilities: what the build's tuningRunner.py could do when the session was opened
(read from its --help: "E4: gpus, batch, two-stage, ...; spaces quick, full"), so a session read
back names them too (`session show`, --json), not only `session new`.

Sessions opened before it (and CPU/sleep/imported sessions) have "".

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 20:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("capabilities", sa.String(500), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("capabilities")
