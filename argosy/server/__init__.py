"""The control plane: `argosy server` (tool layer).

REST API under /api/v1 (FastAPI, OpenAPI at /docs), a durable store (SQLAlchemy,
SQLite by default, alembic migrations), the scheduler library running on the real clock
(the server only applies its decisions), an executor that runs the jobs (local or Ray),
token auth and `/metrics`. See docs/server.md for every field.

Importing this package imports nothing heavy; `argosy.server.app` imports FastAPI.
"""

__all__: list[str] = []
