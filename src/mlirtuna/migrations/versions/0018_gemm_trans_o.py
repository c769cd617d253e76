"""gemm_config.trans_o: every gemm problem knows its -transO (default false).

rocmlirTriton's E4 perfRunner prints `-transO false|true` in every gemm key, so a gemm problem
always has an output transpose. Rows written before it had NULL ("the line did not say"): import
refused any -transO then, so each of them is a `-transO false` problem. Their test vectors stay
as they are (the E3 form, which spells -transO only when it is true).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 02:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        sa.text("UPDATE gemm_config SET trans_o = :no WHERE trans_o IS NULL").bindparams(no=False)
    )
    with op.batch_alter_table("gemm_config", schema=None) as batch_op:
        batch_op.alter_column(
            "trans_o", existing_type=sa.Boolean(), nullable=False, server_default="0"
        )


def downgrade() -> None:
    with op.batch_alter_table("gemm_config", schema=None) as batch_op:
        batch_op.alter_column(
            "trans_o", existing_type=sa.Boolean(), nullable=True, server_default=None
        )
