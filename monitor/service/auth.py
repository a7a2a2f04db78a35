"""API tokens: random, shown once, stored as SHA-256; roles ``producer``, ``reviewer``, ``admin``.

A producer (the worker) may only trigger; a reviewer may read cases,
acknowledge, resolve, label and silence; an admin may do everything, and
manage tokens, channels and policies. Tokens carry 256 random bits, so one
unsalted SHA-256 is enough (as for GitHub tokens): nothing to brute-force.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from monitor.service.db import utcnow
from monitor.service.models import ROLES, ApiToken

TOKEN_PREFIX = "vgl_"
_TOUCH_EVERY = timedelta(minutes=1)

# role -> the roles it acts as (admin acts as every role)
GRANTS: dict[str, frozenset[str]] = {
    "producer": frozenset({"producer"}),
    "reviewer": frozenset({"reviewer"}),
    "admin": frozenset(ROLES),
}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name and role."""

    token_id: int
    name: str
    role: str

    def may(self, role: str) -> bool:
        return role in GRANTS.get(self.role, frozenset())


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(
    session: Session, name: str, role: str, *, now: datetime | None = None
) -> tuple[ApiToken, str]:
    """Store a new token; return the row and the plaintext, which is never stored."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    if not name or len(name) > 100:
        raise ValueError("a token needs a name of 1 to 100 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        name=name,
        role=role,
        token_hash=hash_token(token),
        prefix=token[: len(TOKEN_PREFIX) + 4],
        created_at=now or utcnow(),
    )
    session.add(row)
    session.flush()
    return row, token


def authenticate(session: Session, token: str, *, now: datetime | None = None) -> Principal | None:
    """The principal for a presented token, or None if unknown or revoked."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    if row is None or row.revoked_at is not None:
        return None
    now = now or utcnow()
    if row.last_used_at is None or now - row.last_used_at > _TOUCH_EVERY:
        row.last_used_at = now
    return Principal(row.id, row.name, row.role)


def principal_for_id(session: Session, token_id: int) -> Principal | None:
    """The principal behind a browser session (None once its token is revoked)."""
    row = session.get(ApiToken, token_id)
    if row is None or row.revoked_at is not None:
        return None
    return Principal(row.id, row.name, row.role)


def revoke_token(
    session: Session, token_id: int, *, now: datetime | None = None
) -> ApiToken | None:
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = now or utcnow()
    return row


def provision_store(database_url: str, tokens: dict[str, str]) -> dict[str, str]:
    """Migrate the store at ``database_url`` and issue one token per ``{name: role}``.

    Returns ``{name: token}`` (plaintext, shown once). For demos, benches and tests
    that stand up a paging service of their own.
    """
    from monitor.service.db import make_engine, make_sessionmaker, session_scope, upgrade_database

    engine = make_engine(database_url)
    try:
        upgrade_database(engine)
        with session_scope(make_sessionmaker(engine)) as session:
            return {name: create_token(session, name, role)[1] for name, role in tokens.items()}
    finally:
        engine.dispose()
