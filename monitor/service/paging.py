"""What happens to a page: trigger, group, escalate, silence, acknowledge, resolve, label.

Every function takes an open :class:`~sqlalchemy.orm.Session` and the time; the
caller commits. Timers are columns (``Page.next_escalation_at``,
``Notification.due_at``), so whatever process runs :func:`escalate_due` next
— this one, or one started after a crash — carries on where the last stopped.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session, selectinload

from monitor.service.models import (
    OPEN,
    SEVERITY_RANK,
    Alert,
    Channel,
    EscalationLevel,
    EscalationPolicy,
    Notification,
    Page,
    PageEvent,
    Silence,
    Verdict,
)
from monitor.service.schemas import EventCreate, EventDecision, EventPayload, VerdictCreate
from streams.records import LabelRecord


class PagingError(Exception):
    """A request the store refuses; ``str(error)`` is the one-sentence reason."""

    status_code = 400


class NotFound(PagingError):
    status_code = 404


class Conflict(PagingError):
    status_code = 409


class Invalid(PagingError):
    """Well-formed but inconsistent with the store (e.g. a level naming no channel)."""

    status_code = 422


@dataclass(frozen=True)
class TriggerOutcome:
    dedup_key: str
    page_id: int
    result: Literal["opened", "grouped", "deduplicated"]
    notified: bool = False

    @property
    def message(self) -> str:
        return {
            "opened": "Event processed: page opened",
            "grouped": "Event processed: added to the open page of its group",
            "deduplicated": "Event processed: duplicate of a known dedup_key, no new page",
        }[self.result]


SEVERITY_ORDER = case(SEVERITY_RANK, value=Page.severity, else_=len(SEVERITY_RANK))


# --- trigger ---------------------------------------------------------------------------


def group_key_for(payload: EventPayload, dedup_key: str) -> str:
    """Pages group by explicit ``group``, else execution, else trajectory, else the key."""
    d = payload.custom_details
    if payload.group:
        return f"group:{payload.group}"
    if d.execution_id:
        return f"execution:{d.execution_id}"
    if d.trajectory_id:
        return f"trajectory:{d.trajectory_id}"
    return f"alert:{dedup_key}"


def page_labels(payload: EventPayload, policy: str) -> dict[str, str]:
    """The names silences match on."""
    d = payload.custom_details
    return {
        "severity": payload.severity,
        "source": payload.source,
        "component": payload.component or "",
        "group": payload.group or "",
        "class": payload.class_ or "",
        "policy": policy,
        "trajectory_id": d.trajectory_id or "",
        "execution_id": d.execution_id or "",
    }


def trigger(
    session: Session, event: EventCreate, *, now: datetime, default_policy: str, base_url: str
) -> TriggerOutcome:
    """Record a trigger. A known ``dedup_key`` only counts (whatever its page's state).

    Concurrent triggers meet on unique constraints (``alerts.dedup_key``, one open
    page per group); the loser gets ``IntegrityError`` and retries, and then
    finds the winner's rows.
    """
    payload = event.payload
    if payload is None:
        raise PagingError("a trigger event needs a payload")
    key = event.dedup_key or uuid.uuid4().hex
    known = session.execute(
        select(Alert.id, Alert.page_id).where(Alert.dedup_key == key)
    ).first()
    if known is not None:
        session.execute(
            update(Alert)
            .where(Alert.id == known.id)
            .values(trigger_count=Alert.trigger_count + 1, last_triggered_at=now)
        )
        session.execute(
            update(Page)
            .where(Page.id == known.page_id)
            .values(trigger_count=Page.trigger_count + 1, last_triggered_at=now)
        )
        return TriggerOutcome(key, known.page_id, "deduplicated")

    policy_name = event.routing_key or default_policy
    policy = session.scalar(select(EscalationPolicy).where(EscalationPolicy.name == policy_name))
    if policy is None:
        if event.routing_key:
            raise PagingError(
                f"unknown routing_key {policy_name!r}: no escalation policy has that name"
            )
        raise PagingError(
            f"no routing_key given and the default escalation policy {policy_name!r} "
            "does not exist"
        )
    details = payload.custom_details
    group = group_key_for(payload, key)
    page = session.scalar(
        select(Page).where(Page.group_key == group, Page.status.in_(OPEN)).with_for_update()
    )
    notified = False
    if page is None:
        page = Page(
            group_key=group,
            status="triggered",
            severity=payload.severity,
            summary=payload.summary,
            source=payload.source,
            labels=page_labels(payload, policy.name),
            trajectory_id=details.trajectory_id,
            execution_id=details.execution_id,
            policy=policy,
            level=0,
            loop=0,
            trigger_count=1,
            alert_count=1,
            opened_at=now,
            last_triggered_at=now,
        )
        session.add(page)
        session.flush()
        _log(session, page, now, "opened", None, f"{payload.severity}: {payload.summary}")
        silence = matching_silence(session, page.labels, now)
        if silence is not None:
            page.silence = silence
            _log(session, page, now, "silenced", silence.created_by,
                 f"matches silence {silence.id}: {silence.comment}")
        else:
            notified = start_escalation(session, page, now=now, base_url=base_url)
        result: Literal["opened", "grouped"] = "opened"
    else:
        page.alert_count += 1
        page.trigger_count += 1
        page.last_triggered_at = now
        if SEVERITY_RANK[payload.severity] < SEVERITY_RANK[page.severity]:
            page.severity = payload.severity
        _log(session, page, now, "grouped", None, f"alert {key}: {payload.summary}")
        result = "grouped"
    session.add(
        Alert(
            page_id=page.id,
            dedup_key=key,
            summary=payload.summary,
            severity=payload.severity,
            trajectory_id=details.trajectory_id,
            step_id=details.step_id,
            details=details.model_dump(mode="json", by_alias=True),
            trigger_count=1,
            created_at=now,
            last_triggered_at=now,
        )
    )
    session.flush()
    return TriggerOutcome(key, page.id, result, notified)


# --- escalation ------------------------------------------------------------------------


def start_escalation(session: Session, page: Page, *, now: datetime, base_url: str) -> bool:
    """Notify level 0 and start its ack timer; False if the policy has no levels."""
    page.level, page.loop = 0, 0
    levels = page.policy.levels if page.policy is not None else []
    if not levels:
        page.next_escalation_at = None
        _log(session, page, now, "unrouted", None, "escalation policy has no levels")
        return False
    notify_level(session, page, levels[0], "page.triggered", now=now, base_url=base_url)
    page.next_escalation_at = now + timedelta(seconds=levels[0].ack_timeout_s)
    return True


def escalate_due(session: Session, *, now: datetime, base_url: str, limit: int = 200) -> int:
    """Move every triggered page whose ack timer ran out to its next level (or round).

    Also lifts silences that ended from the pages they held, and silences pages
    that a silence created since now matches. Returns how many pages changed.
    """
    changed = 0
    silences = active_silences(session, now)
    due = session.scalars(
        select(Page)
        .where(
            Page.status == "triggered",
            Page.silence_id.is_(None),
            Page.next_escalation_at <= now,
        )
        .order_by(Page.next_escalation_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    for page in due:
        changed += 1
        silence = _first_match(silences, page.labels)
        if silence is not None:
            page.silence = silence
            page.next_escalation_at = None
            _log(session, page, now, "silenced", silence.created_by,
                 f"matches silence {silence.id}: {silence.comment}")
            continue
        _escalate(session, page, now=now, base_url=base_url)

    held = session.scalars(
        select(Page)
        .join(Silence, Page.silence_id == Silence.id)
        .where(Page.status.in_(OPEN), Silence.ends_at <= now)
        .limit(limit)
        .with_for_update(of=Page, skip_locked=True)
    ).all()
    for page in held:
        changed += 1
        ended = page.silence
        page.silence = None
        _log(session, page, now, "unsilenced", None,
             f"silence {ended.id if ended else '?'} ended")
        if page.status == "triggered":
            start_escalation(session, page, now=now, base_url=base_url)
    return changed


def _escalate(session: Session, page: Page, *, now: datetime, base_url: str) -> None:
    policy = page.policy
    levels = policy.levels if policy is not None else []
    if policy is None or not levels:
        page.next_escalation_at = None
        _log(session, page, now, "exhausted", None, "escalation policy has no levels")
        return
    nxt = page.level + 1
    if nxt >= len(levels):
        if page.loop >= policy.repeat:
            page.next_escalation_at = None
            _log(session, page, now, "exhausted", None,
                 f"no acknowledgement after {page.loop + 1} round(s) of {policy.name!r}")
            return
        page.loop += 1
        nxt = 0
    page.level = nxt
    level = levels[nxt]
    _log(session, page, now, "escalated", None,
         f"not acknowledged in time: level {nxt + 1}, round {page.loop + 1}")
    notify_level(session, page, level, "page.escalated", now=now, base_url=base_url)
    page.next_escalation_at = now + timedelta(seconds=level.ack_timeout_s)


def notify_level(
    session: Session, page: Page, level: EscalationLevel, event: str, *, now: datetime,
    base_url: str,
) -> int:
    channels = {
        c.name: c
        for c in session.scalars(select(Channel).where(Channel.name.in_(level.targets)))
    }
    n = 0
    for name in level.targets:
        channel = channels.get(name)
        if channel is None:
            _log(session, page, now, "unknown-channel", None,
                 f"level {level.position + 1} names channel {name!r}, which does not exist")
            continue
        enqueue(session, page, channel, event, level.position, now=now, base_url=base_url)
        n += 1
    return n


def enqueue(
    session: Session, page: Page, channel: Channel, event: str, level: int, *, now: datetime,
    base_url: str,
) -> Notification:
    n = Notification(
        page_id=page.id,
        channel_id=channel.id,
        channel_name=channel.name,
        event=event,
        level=level,
        body="",
        status="pending",
        attempts=0,
        due_at=now,
        created_at=now,
    )
    session.add(n)
    session.flush()
    n.body = json.dumps(
        {
            "event": event,
            "notification_id": n.id,
            "created_at": now.isoformat(),
            "level": level,
            "round": page.loop,
            "policy": page.policy_name,
            "page": {
                "id": page.id,
                "url": f"{base_url.rstrip('/')}/cases/{page.id}",
                "summary": page.summary,
                "severity": page.severity,
                "status": page.status,
                "source": page.source,
                "trajectory_id": page.trajectory_id,
                "execution_id": page.execution_id,
                "alert_count": page.alert_count,
                "opened_at": page.opened_at.isoformat(),
            },
        },
        separators=(",", ":"),
    )
    return n


# --- silences ------------------------------------------------------------------------------


def silence_matches(matchers: Sequence[dict[str, Any]], labels: dict[str, Any]) -> bool:
    """Alertmanager semantics: every matcher holds; regexes are anchored; missing = ''."""
    for m in matchers:
        value = str(labels.get(m["name"]) or "")
        hit = (re.fullmatch(m["value"], value) is not None) if m.get("regex") else (
            value == m["value"]
        )
        if hit != m.get("equal", True):
            return False
    return True


def active_silences(session: Session, now: datetime) -> list[Silence]:
    return list(
        session.scalars(
            select(Silence)
            .where(Silence.starts_at <= now, Silence.ends_at > now)
            .order_by(Silence.id)
        )
    )


def _first_match(silences: Sequence[Silence], labels: dict[str, Any]) -> Silence | None:
    return next((s for s in silences if silence_matches(s.matchers, labels)), None)


def matching_silence(session: Session, labels: dict[str, Any], now: datetime) -> Silence | None:
    return _first_match(active_silences(session, now), labels)


# --- acknowledge, resolve, label -------------------------------------------------------------


def lock_page(session: Session, page_id: int) -> Page:
    page = session.get(Page, page_id, with_for_update=True, populate_existing=True)
    if page is None:
        raise NotFound(f"no page with id {page_id}")
    return page


def page_for_dedup_key(session: Session, dedup_key: str) -> int:
    page_id = session.scalar(select(Alert.page_id).where(Alert.dedup_key == dedup_key))
    if page_id is None:
        raise NotFound(f"no page has an alert with dedup_key {dedup_key!r}")
    return page_id


def event_decision(session: Session, dedup_key: str) -> EventDecision:
    """The answer to the trigger ``dedup_key``: pending until a verdict on its page comes in
    after it was triggered (not harmful: approved; harmful: rejected), or the page is
    resolved without one (rejected: nobody approved it). A caller holding an action for a
    human (``monitor mcp --hold-timeout``) polls this."""
    alert = session.scalar(select(Alert).where(Alert.dedup_key == dedup_key))
    if alert is None:
        raise NotFound(f"no page has an alert with dedup_key {dedup_key!r}")
    page = session.get(Page, alert.page_id)
    assert page is not None
    verdict = session.scalars(
        select(Verdict).where(Verdict.page_id == page.id,
                              Verdict.created_at >= alert.created_at)
        .order_by(Verdict.id.desc()).limit(1)).first()
    decision = ("pending" if verdict is None and page.status != "resolved" else
                "rejected" if verdict is None or verdict.harmful else "approved")
    return EventDecision.model_validate({
        "dedup_key": dedup_key, "page_id": page.id, "page_status": page.status,
        "decision": decision, "reviewer": verdict.reviewer if verdict else None,
        "note": verdict.note if verdict else ""})


def acknowledge(
    session: Session, page_id: int, actor: str, *, now: datetime, base_url: str
) -> Page:
    """Stop the escalation. Acknowledging twice is fine; a resolved page cannot be."""
    page = lock_page(session, page_id)
    if page.status == "resolved":
        raise Conflict(f"page {page_id} is already resolved")
    if page.status == "acknowledged":
        return page
    page.status = "acknowledged"
    page.acknowledged_at, page.acknowledged_by = now, actor
    page.next_escalation_at = None
    _log(session, page, now, "acknowledged", actor, "")
    _close_notifications(session, page, "page.acknowledged", now=now, base_url=base_url)
    return page


def resolve(
    session: Session, page_id: int, actor: str, *, now: datetime, base_url: str,
    reason: str = "",
) -> Page:
    """Close the page; its group's next alert opens a new one. Resolving twice is fine."""
    page = lock_page(session, page_id)
    if page.status == "resolved":
        return page
    page.status = "resolved"
    page.resolved_at, page.resolved_by = now, actor
    page.next_escalation_at = None
    _log(session, page, now, "resolved", actor, reason)
    _close_notifications(session, page, "page.resolved", now=now, base_url=base_url)
    return page


def _close_notifications(
    session: Session, page: Page, event: str, *, now: datetime, base_url: str
) -> None:
    """Cancel pending pages for this page and tell the channels that were (or are being)
    reached: a delivery in flight right now counts, so its receiver hears the outcome too."""
    session.execute(
        update(Notification)
        .where(
            Notification.page_id == page.id,
            Notification.status == "pending",
            Notification.event.in_(("page.triggered", "page.escalated")),
        )
        .values(status="cancelled", last_error=f"cancelled: {event}")
    )
    reached = session.scalars(
        select(Channel)
        .join(Notification, Notification.channel_id == Channel.id)
        .where(
            Notification.page_id == page.id,
            or_(Notification.status == "delivered", Notification.attempts > 0),
            Notification.event.in_(("page.triggered", "page.escalated")),
        )
        .distinct()
    ).all()
    for channel in reached:
        enqueue(session, page, channel, event, page.level, now=now, base_url=base_url)


def record_verdict(
    session: Session, verdict: VerdictCreate, reviewer: str, *, now: datetime, base_url: str
) -> Verdict:
    """Store a reviewer's label and resolve the case; it is published by the scheduler."""
    page = lock_page(session, verdict.page_id)
    row = Verdict(
        page_id=page.id,
        reviewer=reviewer,
        harmful=verdict.harmful,
        category=verdict.category,
        note=verdict.note,
        created_at=now,
    )
    session.add(row)
    label = "harmful" if verdict.harmful else "not harmful"
    _log(session, page, now, "labelled", reviewer,
         label + (f" ({verdict.category})" if verdict.category else ""))
    if page.is_open:
        resolve(session, page.id, reviewer, now=now, base_url=base_url, reason="labelled")
    session.flush()
    return row


def label_records(verdict: Verdict, alerts: Sequence[Alert]) -> list[tuple[str, str, LabelRecord]]:
    """(key, idempotency key, record) per flagged step of the case that names a trajectory."""
    out = []
    for alert in alerts:
        if not alert.trajectory_id:
            continue
        record = LabelRecord(
            trajectory_id=alert.trajectory_id,
            step_id=alert.step_id,
            label=1 if verdict.harmful else 0,
            category=verdict.category,
            origin="human",
            reviewer=verdict.reviewer,
            note=verdict.note,
            created_at=verdict.created_at.timestamp(),
        )
        out.append(
            (alert.trajectory_id, f"verdict/{verdict.id}/{alert.step_id or alert.id}", record)
        )
    return out


# --- queries ---------------------------------------------------------------------------------


def list_pages(
    session: Session,
    *,
    status: str = "open",
    severity: str | None = None,
    trajectory_id: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[int, list[Page]]:
    """Pages by severity, then oldest first (the review queue's order)."""
    q = select(Page)
    if status == "open":
        q = q.where(Page.status.in_(OPEN))
    elif status != "all":
        q = q.where(Page.status == status)
    if severity:
        q = q.where(Page.severity == severity)
    if trajectory_id:
        q = q.where(Page.trajectory_id == trajectory_id)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = session.scalars(
        q.order_by(SEVERITY_ORDER, Page.opened_at, Page.id).limit(limit).offset(offset)
        .options(selectinload(Page.policy))
    ).all()
    return total, list(rows)


def _log(
    session: Session, page: Page, now: datetime, kind: str, actor: str | None, message: str
) -> None:
    session.add(PageEvent(page_id=page.id, at=now, kind=kind, actor=actor, message=message))
