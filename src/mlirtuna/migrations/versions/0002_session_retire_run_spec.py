"""session: retired_at, run_spec; tuner holds a full tuner spec

Revision ID: 0002
Revises: 0006
Create Date: 2026-12-03 06:40:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0006"
branch_labels = None
depends_on = None

_UTC = (
    sa.DateTime()
    .with_variant(mysql.DATETIME(fsp=6), "mariadb")
    .with_variant(mysql.DATETIME(fsp=6), "mysql")
)


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.alter_column(
            "tuner",
            existing_type=sa.String(length=16),
            type_=sa.String(length=200),
            existing_nullable=False,
        )
        batch_op.add_column(sa.Column("retired_at", _UTC, nullable=True))
        batch_op.add_column(sa.Column("run_spec", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("run_spec")
        batch_op.drop_column("retired_at")
        batch_op.alter_column(
            "tuner",
            existing_type=sa.String(length=200),
            type_=sa.String(length=16),
            existing_nullable=False,
        )
