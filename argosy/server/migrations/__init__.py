"""Alembic migrations of the server's store; `argosy.server.store.migrate` runs them."""
