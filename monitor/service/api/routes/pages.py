"""Pages (cases): list, read, acknowledge, resolve, and their notification log."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import NowDep, ReviewerDep, SchedulerDep, SessionDep, SettingsDep
from monitor.service.models import Notification, Page
from monitor.service.schemas import (
    MAX_ID,
    NotificationPublic,
    PageDetail,
    PageList,
    PagePublic,
    Severity,
)

router = APIRouter(prefix="/api/v1/pages", tags=["pages"], responses=responses.AUTH)

PageId = Annotated[int, Path(ge=1, le=MAX_ID, description="page id")]


@router.get("", response_model=PageList, summary="List pages, most severe and oldest first")
def list_pages(
    session: SessionDep,
    _: ReviewerDep,
    status: Literal["open", "triggered", "acknowledged", "resolved", "all"] = "open",
    severity: Severity | None = None,
    trajectory_id: Annotated[str | None, Query(max_length=255, pattern=r"^[^\x00]+$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> PageList:
    total, rows = paging.list_pages(session, status=status, severity=severity,
                                    trajectory_id=trajectory_id, limit=limit, offset=offset)
    return PageList(count=total, items=[PagePublic.model_validate(p) for p in rows])


@router.get("/{page_id}", response_model=PageDetail, responses=responses.NOT_FOUND,
            summary="A page with its alerts (the case data), timeline and verdicts")
def read_page(page_id: PageId, session: SessionDep, _: ReviewerDep) -> PageDetail:
    page = session.get(Page, page_id)
    if page is None:
        raise paging.NotFound(f"no page with id {page_id}")
    return PageDetail.model_validate(page)


@router.post("/{page_id}/acknowledge", response_model=PagePublic,
             responses={**responses.NOT_FOUND, **responses.CONFLICT},
             summary="Acknowledge: stop the escalation")
def acknowledge_page(
    page_id: PageId, session: SessionDep, principal: ReviewerDep, settings: SettingsDep,
    now: NowDep, scheduler: SchedulerDep,
) -> PagePublic:
    page = paging.acknowledge(session, page_id, principal.name, now=now,
                              base_url=settings.public_url)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return PagePublic.model_validate(page)


@router.post("/{page_id}/resolve", response_model=PagePublic, responses=responses.NOT_FOUND,
             summary="Resolve: close the page")
def resolve_page(
    page_id: PageId, session: SessionDep, principal: ReviewerDep, settings: SettingsDep,
    now: NowDep, scheduler: SchedulerDep,
) -> PagePublic:
    page = paging.resolve(session, page_id, principal.name, now=now,
                          base_url=settings.public_url)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return PagePublic.model_validate(page)


@router.get("/{page_id}/notifications", response_model=list[NotificationPublic],
            responses=responses.NOT_FOUND, summary="The page's notifications and delivery log")
def list_notifications(
    page_id: PageId, session: SessionDep, _: ReviewerDep
) -> list[NotificationPublic]:
    if session.get(Page, page_id) is None:
        raise paging.NotFound(f"no page with id {page_id}")
    rows = session.scalars(
        select(Notification).where(Notification.page_id == page_id).order_by(Notification.id)
    ).all()
    return [NotificationPublic.model_validate(n) for n in rows]
