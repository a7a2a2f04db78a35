"""``POST /api/v1/events``: trigger, acknowledge and resolve, PagerDuty Events v2 style."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status
from sqlalchemy.exc import IntegrityError

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import (
    NowDep,
    PrincipalDep,
    SchedulerDep,
    SessionDep,
    SettingsDep,
    ensure_role,
)
from monitor.service.schemas import EventAccepted, EventCreate, EventDecision

router = APIRouter(prefix="/api/v1/events", tags=["events"], responses=responses.AUTH)

_RETRIES = 3  # concurrent triggers of one key or group: the loser retries and finds the winner


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=EventAccepted,
    responses={**responses.BAD_REQUEST, **responses.NOT_FOUND, **responses.CONFLICT},
    summary="Send a trigger, acknowledge or resolve event",
)
def enqueue_event(
    event: EventCreate,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    scheduler: SchedulerDep,
) -> EventAccepted:
    """A **trigger** opens a page, or adds its alert to the open page of its group (same
    execution, else same trajectory, else same `payload.group`). A trigger whose
    `dedup_key` is already known — open or resolved — opens nothing: redeliveries never
    page twice. **acknowledge** stops the escalation; **resolve** closes the page.

    Producers may trigger; reviewers may acknowledge and resolve; admins may do all.
    """
    if event.event_action == "trigger":
        ensure_role(principal, "producer", "a trigger event")
        for attempt in range(_RETRIES):
            try:
                outcome = paging.trigger(session, event, now=now,
                                         default_policy=settings.default_policy,
                                         base_url=settings.public_url)
                session.commit()
                break
            except IntegrityError:
                session.rollback()
                if attempt == _RETRIES - 1:
                    raise
        if outcome.notified and scheduler is not None:
            scheduler.wake()
        return EventAccepted(message=outcome.message, dedup_key=outcome.dedup_key)

    ensure_role(principal, "reviewer", f"an {event.event_action} event")
    assert event.dedup_key is not None
    page_id = paging.page_for_dedup_key(session, event.dedup_key)
    if event.event_action == "acknowledge":
        paging.acknowledge(session, page_id, principal.name, now=now,
                           base_url=settings.public_url)
    else:
        paging.resolve(session, page_id, principal.name, now=now, base_url=settings.public_url)
    session.commit()
    if scheduler is not None:
        scheduler.wake()
    return EventAccepted(message=f"Event processed: page {event.event_action}d",
                         dedup_key=event.dedup_key)


@router.get(
    "/{dedup_key:path}",
    response_model=EventDecision,
    responses=responses.NOT_FOUND,
    summary="What became of a trigger: its page, and a reviewer's answer",
)
def event_decision(
    dedup_key: Annotated[str, Path(min_length=1, max_length=255)],
    _: PrincipalDep,
    session: SessionDep,
) -> EventDecision:
    """`pending` until a reviewer's verdict on the trigger's page comes in after it
    (not harmful: `approved`; harmful: `rejected`), or the page is resolved without one
    (`rejected`). A producer holding an action for a human polls this with the key it
    triggered (`monitor mcp --hold-timeout`). Any token may read it."""
    return paging.event_decision(session, dedup_key)
