"""Alembic environment, driven programmatically (``monitor.service.db.upgrade_database``).

The caller passes an open connection in ``config.attributes["connection"]``;
without one (``alembic -x url=...`` from a shell) the URL comes from ``-x url``,
``sqlalchemy.url`` or ``$VIGIL_PAGING_DATABASE_URL``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from monitor.service.models import Base

config = context.config
target_metadata = Base.metadata

# any constant: serialises concurrent migrations from several service instances on PostgreSQL
_ADVISORY_LOCK = 7_411_003


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK})"))
        context.run_migrations()


def _url() -> str:
    import os

    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("VIGIL_PAGING_DATABASE_URL")
    )
    if not url:
        raise SystemExit("no database: pass -x url=... or set VIGIL_PAGING_DATABASE_URL")
    return url


connection = config.attributes.get("connection")
if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    _run(connection)
else:
    from monitor.service.db import make_engine

    engine = make_engine(_url())
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()
