"""Searched sessions (issue 45): session.search (a strategy of mlirtuna.search; NULL: the whole
space, as before) and session.search_budget (measurements per job); candidate.search_round (the
round of the search that measured it; NULL: not searched); and search_step, every measurement of
a searched job written as soon as its round is taken (fenced by the attempt's lease token), so
that a new attempt after a dead worker replays them instead of measuring them again.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 08:00:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_UTC = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search", sa.String(32), nullable=True))
        batch_op.add_column(sa.Column("search_budget", sa.Integer(), nullable=True))
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search_round", sa.Integer(), nullable=True))
    op.create_table(
        "search_step",
        sa.Column("id", _BIG_ID, nullable=False),
        sa.Column("job_id", _BIG_ID, nullable=False),
        sa.Column("lease_token", sa.String(32), nullable=False),
        sa.Column("search_round", sa.Integer(), nullable=False),
        sa.Column("perf_config", sa.String(255), nullable=False),
        sa.Column("kernel_time", sa.Double(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_search_step_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_search_step")),
    )
    with op.batch_alter_table("search_step", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_search_step_job_id"), ["job_id"])


def downgrade() -> None:
    op.drop_table("search_step")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("search_round")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("search_budget")
        batch_op.drop_column("search")
