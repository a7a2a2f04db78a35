"""Request dependencies, as named aliases (``SessionDep``, ``ReviewerDep``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from monitor.service.auth import Principal, authenticate
from monitor.service.scheduler import Scheduler
from monitor.service.screen import ScreenQueue
from monitor.service.settings import PagingSettings

bearer = HTTPBearer(
    auto_error=False,
    description="API token: `Authorization: Bearer vgl_...` (`monitor paging token create`)",
)


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_settings(request: Request) -> PagingSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_now(request: Request) -> datetime:
    return request.app.state.clock()  # type: ignore[no-any-return]


def get_scheduler(request: Request) -> Scheduler | None:
    return getattr(request.app.state, "scheduler", None)


SCREEN_DISABLED = (
    "pre-execution screening is off: start the service with --screen-policy PATH (or "
    "VIGIL_PAGING_SCREEN_POLICY) naming a calibrated policy from `monitor calibrate`"
)


def get_screen_queue(request: Request) -> ScreenQueue:
    queue: ScreenQueue | None = getattr(request.app.state, "screen", None)
    if queue is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, SCREEN_DISABLED)
    return queue


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[PagingSettings, Depends(get_settings)]
NowDep = Annotated[datetime, Depends(get_now)]
SchedulerDep = Annotated[Scheduler | None, Depends(get_scheduler)]
ScreenQueueDep = Annotated[ScreenQueue, Depends(get_screen_queue)]


CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def get_principal(session: SessionDep, now: NowDep, credentials: CredentialsDep) -> Principal:
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing API token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = authenticate(session, credentials.credentials, now=now)
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "invalid or revoked API token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require(role: str) -> Callable[[Principal], Principal]:
    """A dependency that lets ``role`` (and admin) through and refuses others with 403."""

    def check(principal: PrincipalDep) -> Principal:
        ensure_role(principal, role)
        return principal

    check.__name__ = f"require_{role}"
    return check


def ensure_role(principal: Principal, role: str, action: str | None = None) -> None:
    if not principal.may(role):
        what = action or "this"
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"token {principal.name!r} has role {principal.role!r}; {what} needs {role!r} "
            "or 'admin'",
        )


def get_harness(request: Request, now: NowDep, credentials: CredentialsDep) -> Principal:
    """A producer (or admin) token, checked in a transaction of its own that ends before the
    handler runs: ``POST /v1/screen`` holds no database connection while models run (SQLite
    has one writer, so a held session would serialise every screening request)."""
    with request.app.state.sessions() as session:
        principal = get_principal(session, now, credentials)
        session.commit()  # last_used_at
    ensure_role(principal, "producer", "screening")
    return principal


ProducerDep = Annotated[Principal, Depends(require("producer"))]
HarnessDep = Annotated[Principal, Depends(get_harness)]
ReviewerDep = Annotated[Principal, Depends(require("reviewer"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]
