"""gemm_gemm, conv_gemm and fusion config tables

Revision ID: 0005
Revises: 0002
Create Date: 2026-12-03 07:00:00

New tables only: an existing database keeps every row and gains the three ops.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0002"
branch_labels = None
depends_on = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _str(name: str, length: int = 16) -> sa.Column:
    return sa.Column(name, sa.String(length=length), server_default="", nullable=False)


def _int(name: str) -> sa.Column:
    return sa.Column(name, sa.Integer(), server_default="0", nullable=False)


def _bool(name: str) -> sa.Column:
    return sa.Column(name, sa.Boolean(), server_default="0", nullable=False)


def _keys(table: str) -> list:
    return [
        sa.ForeignKeyConstraint(
            ["id"], ["problem.id"], name=op.f(f"fk_{table}_id_problem"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
    ]


def upgrade() -> None:
    op.create_table(
        "gemm_gemm_config",
        _id(),
        _str("data_type"),
        *(_bool(f"trans_{x}") for x in "abco"),
        *(_int(x) for x in ("group_size", "m", "k", "n", "gemm_o")),
        *_keys("gemm_gemm_config"),
    )
    sizes = [
        "batchsize",
        "in_channels",
        "in_h",
        "in_w",
        "out_channels",
        "fil_h",
        "fil_w",
        "pad_h",
        "pad_w",
        "conv_stride_h",
        "conv_stride_w",
        "dilation_h",
        "dilation_w",
        "group_size",
        "gemm_o",
    ]
    op.create_table(
        "conv_gemm_config",
        _id(),
        _str("data_type"),
        _str("fil_layout"),
        _str("in_layout"),
        _bool("trans_c"),
        _bool("trans_o"),
        *(_int(x) for x in sizes),
        *_keys("conv_gemm_config"),
    )
    op.create_table(
        "fusion_config",
        _id(),
        _str("file_name", 255),
        _str("function", 255),
        _str("sha256", 64),
        _str("tuning_key", 700),
        _str("key_op"),
        _str("key_source"),
        sa.Column(
            "module_text",
            sa.Text()
            .with_variant(mysql.MEDIUMTEXT(), "mariadb")
            .with_variant(mysql.MEDIUMTEXT(), "mysql"),
            nullable=False,
        ),
        *_keys("fusion_config"),
    )


def downgrade() -> None:
    op.drop_table("fusion_config")
    op.drop_table("conv_gemm_config")
    op.drop_table("gemm_gemm_config")
