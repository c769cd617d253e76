"""dashboard indexes: result.job_id

A job's page (and `mlirtuna jobs show`) finds the job's winner by job id; without this index
that was a scan of every result (120 ms at a million results, docs/benchmarks.md).

Revision ID: 0009
Revises: 0001
"""

from alembic import op

revision = "0009"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_result_job_id", "result", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_result_job_id", table_name="result")
