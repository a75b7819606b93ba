"""Alembic environment: runs on the connection `argosy.server.store.migrate` hands in."""

from alembic import context

from argosy.server.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
