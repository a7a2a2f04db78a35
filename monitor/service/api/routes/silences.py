"""Silences, as in Alertmanager: matching pages are kept but notify no one until it ends."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, status
from sqlalchemy import select

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import NowDep, ReviewerDep, SchedulerDep, SessionDep
from monitor.service.models import Silence
from monitor.service.schemas import MAX_ID, SilenceCreate, SilencePublic

router = APIRouter(prefix="/api/v1/silences", tags=["silences"], responses=responses.AUTH)


def _public(s: Silence, now: object) -> SilencePublic:
    return SilencePublic.model_validate(
        {**{k: getattr(s, k) for k in ("id", "matchers", "starts_at", "ends_at", "created_by",
                                         "comment", "created_at")},
         "active": s.starts_at <= now < s.ends_at}  # type: ignore[operator]
    )


@router.get("", response_model=list[SilencePublic], summary="List silences")
def list_silences(
    session: SessionDep, _: ReviewerDep, now: NowDep, active: bool = True
) -> list[SilencePublic]:
    q = select(Silence).order_by(Silence.id.desc())
    if active:
        q = q.where(Silence.ends_at > now)
    return [_public(s, now) for s in session.scalars(q.limit(500))]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SilencePublic,
             summary="Silence pages matching every matcher, from starts_at to ends_at")
def create_silence(
    body: SilenceCreate, session: SessionDep, principal: ReviewerDep, now: NowDep,
    scheduler: SchedulerDep,
) -> SilencePublic:
    starts = body.starts_at or now
    ends = body.ends_at or starts + timedelta(seconds=body.duration_s or 0)
    if ends <= starts:
        raise paging.Invalid("a silence must end after it starts")
    silence = Silence(matchers=[m.model_dump() for m in body.matchers], starts_at=starts,
                      ends_at=ends, created_by=principal.name, comment=body.comment,
                      created_at=now)
    session.add(silence)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return _public(silence, now)


@router.delete("/{silence_id}", response_model=SilencePublic, responses=responses.NOT_FOUND,
               summary="Expire a silence now; the pages it held start escalating")
def expire_silence(
    silence_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, _: ReviewerDep,
    now: NowDep, scheduler: SchedulerDep,
) -> SilencePublic:
    silence = session.get(Silence, silence_id)
    if silence is None:
        raise paging.NotFound(f"no silence with id {silence_id}")
    if silence.ends_at > now:
        silence.ends_at = max(now, silence.starts_at)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return _public(silence, now)
