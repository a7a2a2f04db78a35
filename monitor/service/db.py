"""Engine, sessions and migrations. SQLite is the embedded default, PostgreSQL production.

SQLite transactions start with ``BEGIN IMMEDIATE`` (one writer at a time, no
lock upgrades that fail under load), and threads of one process queue for it on
a lock instead of SQLite's sleeping busy handler (which makes long latency
tails); PostgreSQL relies on row locks (``SELECT ... FOR UPDATE``) where two
writers could meet. Migrations run
programmatically (``upgrade_database``), so no ``alembic.ini`` is needed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def utcnow() -> datetime:
    return datetime.now(UTC)


def normalize_url(url: str | URL) -> URL:
    """``postgresql://`` and ``postgres://`` mean psycopg 3, the driver installed with vigil."""
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    try:
        u = make_url(url)
    except Exception as e:  # noqa: BLE001 - sqlalchemy raises ArgumentError with a fine message
        raise ValueError(f"cannot parse database URL {str(url)!r}: {e}") from None
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(
            f"unsupported database {u.get_backend_name()!r}: use sqlite:///FILE or postgresql://..."
        )
    return u


def make_engine(url: str | URL) -> Engine:
    u = normalize_url(url)
    if u.get_backend_name() == "sqlite":
        memory = u.database in (None, "", ":memory:")
        if not memory:
            parent = Path(str(u.database)).expanduser().resolve().parent
            if not parent.is_dir():
                raise ValueError(f"cannot create the SQLite database: no directory {parent}")
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
        if memory:
            kwargs["poolclass"] = StaticPool
        engine = create_engine(u, **kwargs)
        _sqlite_transactions(engine, wal=not memory)
        return engine
    return create_engine(u, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_transactions(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    writer = threading.Lock()  # SQLite has one writer: queue for it here, not in busy-sleeps

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        writer.acquire()
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            writer.release()
            raise
        connection.info["vigil_writer"] = True

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _end(connection: Any) -> None:
        # fired just before the COMMIT/ROLLBACK runs; a thread that begins in between waits
        # in SQLite's busy handler for that one statement only
        if connection.info.pop("vigil_writer", False):
            writer.release()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def _alembic(engine: Engine, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        getattr(command, action)(cfg, revision)


def upgrade_database(engine: Engine, revision: str = "head") -> None:
    """Bring the schema up to ``revision`` (Alembic, programmatic: no alembic.ini needed)."""
    _alembic(engine, "upgrade", revision)


def downgrade_database(engine: Engine, revision: str) -> None:
    """Take the schema down to ``revision`` (``"base"``: drop everything)."""
    _alembic(engine, "downgrade", revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
