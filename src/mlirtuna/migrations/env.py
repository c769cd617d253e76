"""Alembic environment: runs migrations on the engine mlirtuna hands over (never from an ini)."""

from alembic import context

from mlirtuna.db.models import Base

config = context.config
engine = config.attributes["engine"]

with engine.connect() as connection:
    if connection.dialect.name == "sqlite":
        # Batch mode rebuilds a table by copy-and-rename; with foreign keys enforced, dropping the
        # old `session` would break every job/result row that points at it. SQLite only honours
        # this pragma outside a transaction, so it is set before the migration's one transaction;
        # the integrity check afterwards proves the copies kept every reference whole.
        # The driver connection, not exec_driver_sql: SQLAlchemy's autobegin would wrap it in BEGIN.
        connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,  # ALTER TABLE on SQLite goes through batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
    if connection.dialect.name == "sqlite":
        raw = connection.connection.driver_connection
        broken = raw.execute("PRAGMA foreign_key_check").fetchall()
        raw.execute("PRAGMA foreign_keys=ON")
        if broken:
            raise RuntimeError(f"migration left dangling foreign keys: {broken[:5]}")
