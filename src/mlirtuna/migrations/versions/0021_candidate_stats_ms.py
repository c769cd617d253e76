"""candidate.time_min / time_iqr of E3 `.debug` Stats: from ms read as ns to ns (issue 42 §2).

rocmlir-tuning-driver prints its `--show-stats` numbers in milliseconds (only its time column
is ns), and rocMLIR's E3 tuningRunner stores them in the `.debug` Stats column. Releases before
this one read them as ns: the fastest run (time_min) and the IQR (time_iqr, 1.349 * stddev) of
every candidate recorded from E3 Stats are a million times too small. The candidate's
kernel_time (from TFlops) was always right.

Corrected here: a rocmlir session's candidate whose time_min is under a thousandth of its own
kernel_time and that has no sample count (E3 Stats give none). Its fastest run can never be a
thousand times faster than the median of the same runs, so such a row is in the wrong unit for
certain; both columns are multiplied by 10^6. Left alone: rows with a sample count (rocmlirTriton's
MeasurementsMs, always read in ms; the CPU tuner), rows whose time_min is near their time
(written by the stand-in of those releases, which printed ns), rows without statistics (the
driver's legacy {total_cpu_time, iterations} shape, which those releases did not read).
samples, kernel_time, tflops and the result rows are unchanged (the winner's margin is a ratio
of times; its noise needs a sample count, which these rows never had).

Downgrade keeps the corrected numbers: they are right under every schema.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 05:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

NS_PER_MS = 1000000.0
# A fastest run this many times faster than its own median is no measurement: a unit error.
IMPOSSIBLE_RATIO = 0.001


def upgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE candidate SET time_min = time_min * :f, time_iqr = time_iqr * :f"
            " WHERE samples IS NULL AND kernel_time > 0 AND time_min > 0"
            " AND time_min < kernel_time * :ratio"
            " AND session_id IN (SELECT id FROM session WHERE tuner = :tuner)"
        ).bindparams(f=NS_PER_MS, ratio=IMPOSSIBLE_RATIO, tuner="rocmlir")
    )


def downgrade() -> None:
    pass
