"""session_note: lines an operator adds to a session (`mlirtuna session note`; issue 44 §3)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 06:10:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_UTC = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "session_note",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["session.id"], name=op.f("fk_session_note_session_id_session")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_note")),
    )
    with op.batch_alter_table("session_note", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_session_note_session_id"), ["session_id"])


def downgrade() -> None:
    op.drop_table("session_note")
