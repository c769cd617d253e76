"""reuse and quick lists: result.reused_from, session.tuning_space widened, quick_list

Revision ID: 0007
Revises: 0003
Create Date: 2026-12-03 06:40:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0003"
branch_labels = None
depends_on = None

_UTC = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        # `list:NAME` does not fit the 16 characters of the built-in space names.
        batch_op.alter_column(
            "tuning_space",
            existing_type=sa.String(length=16),
            type_=sa.String(length=64),
            existing_nullable=False,
        )
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reused_from", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_result_reused_from_session"), "session", ["reused_from"], ["id"]
        )
    op.create_table(
        "quick_list",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=48), nullable=False),
        sa.Column("arch", sa.String(length=32), nullable=False),
        sa.Column("op", sa.String(length=16), nullable=False),
        sa.Column("data_type", sa.String(length=16), nullable=False),
        sa.Column(
            "perf_configs",
            sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("method", sa.String(length=200), server_default="", nullable=False),
        sa.Column("sessions", sa.String(length=200), server_default="", nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quick_list")),
        sa.UniqueConstraint(
            "name", "arch", "op", "data_type", name=op.f("uq_quick_list_name_arch_op_data_type")
        ),
    )


def downgrade() -> None:
    op.drop_table("quick_list")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_result_reused_from_session"), type_="foreignkey")
        batch_op.drop_column("reused_from")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.alter_column(
            "tuning_space",
            existing_type=sa.String(length=64),
            type_=sa.String(length=16),
            existing_nullable=False,
        )
