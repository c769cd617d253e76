"""PostgreSQL: NOTIFY when a job becomes claimable, so that idle workers wake at once

A job becomes claimable when it is inserted as `new` (jobs load) or its state changes to `new`
(requeue, release, a failed attempt's retry, an expired lease). Idle workers LISTEN on the
channel (worker.py) with their poll interval as the timeout; polling stays the fallback, and
covers a backoff running out (not_before), which changes no row. Other backends: nothing.

Inserts notify once per statement (a load of 100,000 jobs sends one notification per session);
updates notify per row, but only rows whose state became `new`: the WHEN clause is evaluated
without calling the function, so claims, heartbeats and records pay next to nothing.

Revision ID: 0012
Revises: 0008
"""

from alembic import op

revision = "0012"
down_revision = "0008"
branch_labels = None
depends_on = None

CHANNEL = "mlirtuna_job_claimable"  # models.JOB_CLAIMABLE_CHANNEL


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION mlirtuna_notify_loaded() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', s.session_id::text)
            FROM (SELECT DISTINCT session_id FROM loaded WHERE state = 'new') AS s;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION mlirtuna_notify_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.session_id::text);
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_claimable_insert AFTER INSERT ON job REFERENCING NEW TABLE AS loaded "
        "FOR EACH STATEMENT EXECUTE FUNCTION mlirtuna_notify_loaded()"
    )
    op.execute(
        "CREATE TRIGGER job_claimable_update AFTER UPDATE OF state ON job FOR EACH ROW "
        "WHEN (NEW.state = 'new' AND OLD.state IS DISTINCT FROM 'new') "
        "EXECUTE FUNCTION mlirtuna_notify_requeued()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS job_claimable_update ON job")
    op.execute("DROP TRIGGER IF EXISTS job_claimable_insert ON job")
    op.execute("DROP FUNCTION IF EXISTS mlirtuna_notify_requeued()")
    op.execute("DROP FUNCTION IF EXISTS mlirtuna_notify_loaded()")
