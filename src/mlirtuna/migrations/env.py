"""Alembic environment: runs migrations on the engine mlirtuna hands over (never from an ini)."""

from alembic import context

from mlirtuna.models import Base

config = context.config
engine = config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,  # ALTER TABLE on SQLite goes through batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
