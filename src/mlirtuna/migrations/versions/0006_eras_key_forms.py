"""tuning DB eras: key forms, perf-config families, E4 session settings

Revision ID: 0006
Revises: 0009
"""

import re

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
    conn = op.get_bind()
    table = sa.table(table_name, sa.column("perf_config"), sa.column("perf_family"))
    configs = conn.execute(sa.select(table.c.perf_config).distinct()).scalars().all()
    for perf_config in configs:
        conn.execute(
            table.update()
            .where(table.c.perf_config == perf_config)
            .values(perf_family=perf_config_family(perf_config or ""))
        )


# A frozen copy of keys.perf_config_family as it stood when this revision was written: a
# migration must do tomorrow what it did the day it was written, whatever keys.py becomes.
_NAMED_RE = re.compile(r"^(gemm|attn):[A-Za-z]\w*=")
_VERSIONED_RE = re.compile(r"^(?:(gemm|attn):)?v(\d+):")
_CPU_RE = re.compile(r"^cpu:")


def perf_config_family(perf_config: str) -> str:
    """v1 (positional, no prefix), v2 …, attn:vN, gemm:vN, gemm:named / attn:named, cpu; ""
    for E2's "None" or an empty string; "other" for anything else."""
    text = perf_config.strip()
    if not text or text == "None":
        return ""
    if _CPU_RE.match(text):
        return "cpu"
    named = _NAMED_RE.match(text)
    if named:
        return f"{named.group(1)}:named"
    versioned = _VERSIONED_RE.match(text)
    if versioned:
        prefix, version = versioned.group(1), versioned.group(2)
        return f"{prefix}:v{version}" if prefix else f"v{version}"
    if re.fullmatch(r"-?\d+(,-?\d+)+", text):
        return "v1"
    return "other"


def downgrade() -> None:
    with op.batch_alter_table("candidate") as batch:
        batch.drop_column("perf_family")
    with op.batch_alter_table("result") as batch:
        batch.drop_column("key_suffix")
        batch.drop_column("perf_family")
    with op.batch_alter_table("session") as batch:
        for name in ("lfbo_effort", "gpu_run_timeout_s", "warmup_ms", "rep_ms", "key_form"):
            batch.drop_column(name)
