"""tuning DB eras: key forms, perf-config families, E4 session settings

Revision ID: 0006
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session") as batch:
        batch.add_column(
            sa.Column("key_form", sa.String(length=16), server_default="plain", nullable=False)
        )
        batch.add_column(sa.Column("rep_ms", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("warmup_ms", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("gpu_run_timeout_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("lfbo_effort", sa.String(length=8), nullable=True))
    with op.batch_alter_table("result") as batch:
        batch.add_column(
            sa.Column("perf_family", sa.String(length=16), server_default="", nullable=False)
        )
        batch.add_column(
            sa.Column("key_suffix", sa.String(length=255), server_default="", nullable=False)
        )
    with op.batch_alter_table("candidate") as batch:
        batch.add_column(
            sa.Column("perf_family", sa.String(length=16), server_default="", nullable=False)
        )
    _fill_families("result")
    _fill_families("candidate")


def _fill_families(table_name: str) -> None:
    """Rows written before this revision get their family too (one UPDATE per distinct perf
    config: a history repeats few of them)."""
    from mlirtuna.keys import perf_config_family

    conn = op.get_bind()
    table = sa.table(table_name, sa.column("perf_config"), sa.column("perf_family"))
    configs = conn.execute(sa.select(table.c.perf_config).distinct()).scalars().all()
    for perf_config in configs:
        conn.execute(
            table.update()
            .where(table.c.perf_config == perf_config)
            .values(perf_family=perf_config_family(perf_config or ""))
        )


def downgrade() -> None:
    with op.batch_alter_table("candidate") as batch:
        batch.drop_column("perf_family")
    with op.batch_alter_table("result") as batch:
        batch.drop_column("key_suffix")
        batch.drop_column("perf_family")
    with op.batch_alter_table("session") as batch:
        for name in ("lfbo_effort", "gpu_run_timeout_s", "warmup_ms", "rep_ms", "key_form"):
            batch.drop_column(name)
