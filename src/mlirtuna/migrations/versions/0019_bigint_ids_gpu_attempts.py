"""64-bit ids where a table grows without bound (job, result, bundle: candidate and attempt have
had them since 0001) and their foreign keys, so that drawing ids (2 M nextval/s is within the
worker role) cannot exhaust them; and per attempt the GPU it ran on: `gpu` (the GPU's unique
id, or MACHINE:INDEX where none is reported), `gpu_perf` (its performance level where the
tools report one), `worker` (the claiming worker's token), with the index the claim's "no live
attempt of another worker on this GPU" check reads.

SQLite: INTEGER PRIMARY KEY is 64-bit already; only the attempt columns are added.
PostgreSQL: the columns and the id sequences become bigint. MariaDB/MySQL: a column a foreign
key names cannot change type, so the foreign keys on these columns are dropped, the columns
widened, and the keys made again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 02:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# (table, column, nullable, is the table's own auto-increment id)
_IDS = (
    ("job", "id", False, True),
    ("result", "id", False, True),
    ("bundle", "id", False, True),
    ("attempt", "job_id", False, False),
    ("result", "job_id", True, False),
    ("candidate", "job_id", False, False),
    ("bundle", "job_id", False, False),
    ("bundle_chunk", "bundle_id", False, False),
)
# MariaDB/MySQL: (table, name, column, referred table, ON DELETE)
_FKS = (
    ("attempt", "fk_attempt_job_id_job", "job_id", "job", "CASCADE"),
    ("result", "fk_result_job_id_job", "job_id", "job", None),
    ("candidate", "fk_candidate_job_id_job", "job_id", "job", None),
    ("bundle", "fk_bundle_job_id_job", "job_id", "job", None),
    ("bundle_chunk", "fk_bundle_chunk_bundle_id_bundle", "bundle_id", "bundle", "CASCADE"),
)


def upgrade() -> None:
    _widen("bigint", "BIGINT")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu", sa.String(200), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("gpu_perf", sa.String(64), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("worker", sa.String(32), nullable=True))
        batch_op.create_index("ix_attempt_gpu", ["gpu", "ended_at"])


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_index("ix_attempt_gpu")
        batch_op.drop_column("worker")
        batch_op.drop_column("gpu_perf")
        batch_op.drop_column("gpu")
    _widen("integer", "INT")


def _widen(pg_type: str, mysql_type: str) -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        return
    if dialect == "postgresql":
        for table, column, _, own in _IDS:
            op.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {pg_type}')
            if own:
                op.execute(f"ALTER SEQUENCE {table}_{column}_seq AS {pg_type}")
        return
    for table, name, *_ in _FKS:
        op.drop_constraint(name, table, type_="foreignkey")
    for table, column, nullable, own in _IDS:
        null = "NULL" if nullable else "NOT NULL"
        extra = " AUTO_INCREMENT" if own else ""
        op.execute(f"ALTER TABLE `{table}` MODIFY `{column}` {mysql_type} {null}{extra}")
    for table, name, column, referred, ondelete in _FKS:
        op.create_foreign_key(name, table, referred, [column], ["id"], ondelete=ondelete)
