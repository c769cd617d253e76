"""import-tsv remembers each file's hash; jobs list reads a session's jobs in id order

Revision ID: 0003
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN and CREATE INDEX, which SQLite does in place: no batch copy of `session`,
    # whose rows other tables reference.
    op.add_column("session", sa.Column("source_sha256", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_session_source_sha256"), "session", ["source_sha256"], unique=False)
    op.create_index("ix_job_session_list", "job", ["session_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_session_list")
    with op.batch_alter_table("session") as batch:
        batch.drop_index(batch.f("ix_session_source_sha256"))
        batch.drop_column("source_sha256")
