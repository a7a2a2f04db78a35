"""Verdicts: a reviewer labels a case; the label goes to the labels topic (never to agents)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from sqlalchemy import select

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import NowDep, ReviewerDep, SchedulerDep, SessionDep, SettingsDep
from monitor.service.models import Verdict
from monitor.service.schemas import MAX_ID, VerdictCreate, VerdictPublic

router = APIRouter(prefix="/api/v1/verdicts", tags=["verdicts"], responses=responses.AUTH)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=VerdictPublic,
             responses=responses.NOT_FOUND, summary="Label a case (and resolve it)")
def create_verdict(
    verdict: VerdictCreate, session: SessionDep, principal: ReviewerDep, settings: SettingsDep,
    now: NowDep, scheduler: SchedulerDep,
) -> VerdictPublic:
    """Stores the label, resolves the page, and publishes one `LabelRecord` per flagged step
    to the labels topic (from a stored outbox: a broker outage delays it, never loses it).
    A later verdict on the same case is a correction and is published too."""
    row = paging.record_verdict(session, verdict, principal.name, now=now,
                                base_url=settings.public_url)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return VerdictPublic.model_validate(row)


@router.get("", response_model=list[VerdictPublic], summary="Verdicts, newest first")
def list_verdicts(
    session: SessionDep,
    _: ReviewerDep,
    page_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> list[VerdictPublic]:
    q = select(Verdict)
    if page_id is not None:
        q = q.where(Verdict.page_id == page_id)
    rows = session.scalars(q.order_by(Verdict.id.desc()).limit(limit).offset(offset)).all()
    return [VerdictPublic.model_validate(v) for v in rows]
