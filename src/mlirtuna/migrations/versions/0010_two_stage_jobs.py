"""two-stage jobs: job.stage, the session's split and artifact store, bundles

Revision ID: 0010
Revises: 0012
Create Date: 2026-12-03 09:50:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0012"
branch_labels = None
depends_on = None

BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
UTC = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("split", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("artifact_store", sa.String(length=500), nullable=True))
        batch_op.add_column(
            sa.Column("keep_artifacts", sa.Boolean(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("stage", sa.String(length=16), server_default="tune", nullable=False)
        )
    # The new unique key and claim index first: on MySQL/MariaDB an index must serve the
    # session_id foreign key at every moment.
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_unique_constraint(
            "uq_job_session_id_problem_id_stage", ["session_id", "problem_id", "stage"]
        )
        batch_op.drop_constraint("uq_job_session_id_problem_id", type_="unique")
        batch_op.drop_index("ix_job_claim")
        batch_op.create_index(
            "ix_job_claim", ["session_id", "state", "stage", "priority", "id"], unique=False
        )
    op.create_table(
        "bundle",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=32), nullable=False),
        sa.Column("commit_id", sa.String(length=64), server_default="", nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), server_default="", nullable=False),
        sa.Column("path", sa.String(length=700), nullable=True),
        sa.Column("complete", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_bundle_job_id_job")),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problem.id"], name=op.f("fk_bundle_problem_id_problem")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["session.id"], name=op.f("fk_bundle_session_id_session")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bundle")),
    )
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_bundle_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_bundle_problem_id"), ["problem_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_bundle_session_id"), ["session_id"], unique=False)
    op.create_table(
        "bundle_chunk",
        sa.Column("bundle_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("data", BLOB, nullable=False),
        sa.ForeignKeyConstraint(
            ["bundle_id"],
            ["bundle.id"],
            name=op.f("fk_bundle_chunk_bundle_id_bundle"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("bundle_id", "seq", name=op.f("pk_bundle_chunk")),
    )


def downgrade() -> None:
    op.drop_table("bundle_chunk")
    with op.batch_alter_table("bundle", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_bundle_session_id"))
        batch_op.drop_index(batch_op.f("ix_bundle_problem_id"))
        batch_op.drop_index(batch_op.f("ix_bundle_job_id"))
    op.drop_table("bundle")
    two_stage = "SELECT id FROM job WHERE stage <> 'tune'"
    for table in ("result", "candidate"):
        op.execute(f"UPDATE {table} SET job_id = NULL WHERE job_id IN ({two_stage})")
    op.execute("DELETE FROM attempt WHERE job_id IN (" + two_stage + ")")
    op.execute("DELETE FROM job WHERE stage <> 'tune'")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_claim")
        batch_op.create_index(
            "ix_job_claim", ["session_id", "state", "priority", "id"], unique=False
        )
        batch_op.create_unique_constraint(
            "uq_job_session_id_problem_id", ["session_id", "problem_id"]
        )
        batch_op.drop_constraint("uq_job_session_id_problem_id_stage", type_="unique")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("stage")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("keep_artifacts")
        batch_op.drop_column("artifact_store")
        batch_op.drop_column("split")
