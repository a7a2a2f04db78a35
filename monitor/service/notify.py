"""Notification channels: signed webhooks (retried with backoff, every attempt logged) and
the console.

A webhook is ``POST url`` with the JSON body and these headers:

- ``X-Vigil-Signature-256: sha256=<hex>``: HMAC-SHA256 of the exact body bytes with the
  channel's secret (check it with :func:`verify_signature`);
- ``X-Vigil-Delivery``: the notification id, the same on every retry (deduplicate on it);
- ``X-Vigil-Event``: ``page.triggered``, ``page.escalated``, ``page.acknowledged``,
  ``page.resolved``.

Any 2xx is delivered; anything else (or no answer in time) is retried after
``backoff_s * 2**(attempt-1)`` seconds (capped, with up to 10 % jitter) until the
attempts run out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TextIO

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from monitor.service.db import utcnow
from monitor.service.models import DeliveryAttempt, Notification, PageEvent

SIGNATURE_HEADER = "X-Vigil-Signature-256"
DELIVERY_HEADER = "X-Vigil-Delivery"
EVENT_HEADER = "X-Vigil-Event"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """What a receiver does: recompute the HMAC and compare in constant time."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def backoff_s(attempt: int, base_s: float, cap_s: float, *, jitter: float = 0.1) -> float:
    """Delay before the retry that follows failed attempt number ``attempt`` (1-based)."""
    delay = min(cap_s, base_s * 2 ** max(0, attempt - 1))
    return delay * (1 + random.uniform(0, jitter))


@dataclass(frozen=True)
class Delivery:
    """A claimed notification, detached from the session so it can be sent without one."""

    notification_id: int
    page_id: int
    kind: str
    channel_name: str
    url: str | None
    secret: str | None
    event: str
    body: str
    attempt: int


@dataclass(frozen=True)
class DeliveryResult:
    notification_id: int
    attempt: int
    ok: bool
    at: datetime
    duration_ms: float
    status_code: int | None = None
    error: str | None = None


def claim_due(
    session: Session, *, now: datetime, lease_s: float, limit: int = 100
) -> list[Delivery]:
    """Take due notifications. Their ``due_at`` moves ``lease_s`` ahead: if this process
    dies mid-delivery, the next one retries them then (at-least-once)."""
    rows = session.scalars(
        select(Notification)
        .where(Notification.status == "pending", Notification.due_at <= now)
        .order_by(Notification.due_at, Notification.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    out = []
    for n in rows:
        channel = n.channel
        if channel is None:
            n.status, n.last_error = "failed", f"channel {n.channel_name!r} was deleted"
            continue
        n.attempts += 1
        n.due_at = now + timedelta(seconds=lease_s)
        out.append(
            Delivery(
                notification_id=n.id,
                page_id=n.page_id,
                kind=channel.kind,
                channel_name=channel.name,
                url=channel.url,
                secret=channel.secret,
                event=n.event,
                body=n.body,
                attempt=n.attempts,
            )
        )
    return out


async def deliver(client: httpx.AsyncClient, d: Delivery, console: TextIO) -> DeliveryResult:
    start = time.perf_counter()
    at = utcnow()

    def result(ok: bool, status: int | None = None, error: str | None = None) -> DeliveryResult:
        return DeliveryResult(d.notification_id, d.attempt, ok, at,
                              (time.perf_counter() - start) * 1000, status, error)

    if d.kind == "console":
        console.write(console_line(d) + "\n")
        console.flush()
        return result(True)
    if not d.url or not d.secret:
        return result(False, error="webhook channel lacks a url or secret")
    body = d.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "vigil-paging",
        SIGNATURE_HEADER: sign(d.secret, body),
        DELIVERY_HEADER: str(d.notification_id),
        EVENT_HEADER: d.event,
    }
    try:
        response = await client.post(d.url, content=body, headers=headers)
    except httpx.HTTPError as e:
        return result(False, error=f"{type(e).__name__}: {e}"[:2000])
    if 200 <= response.status_code < 300:
        return result(True, response.status_code)
    return result(False, response.status_code, f"HTTP {response.status_code}: "
                  f"{response.text[:500]}")


def console_line(d: Delivery) -> str:
    body = json.loads(d.body)
    page = body["page"]
    return (
        f"[vigil] {d.event} page {page['id']} {page['severity'].upper()} "
        f"level {body['level'] + 1}: {page['summary']} ({page['url']})"
    )


def record_results(
    session: Session,
    results: list[DeliveryResult],
    *,
    now: datetime,
    max_attempts: int,
    base_s: float,
    cap_s: float,
) -> None:
    """Log every attempt; mark delivered, schedule the retry, or give up."""
    for r in results:
        n = session.get(Notification, r.notification_id, with_for_update=True,
                        populate_existing=True)
        if n is None:
            continue
        session.add(
            DeliveryAttempt(
                notification_id=n.id, attempt=r.attempt, at=r.at, duration_ms=r.duration_ms,
                status_code=r.status_code, ok=r.ok, error=r.error,
            )
        )
        if r.ok:
            n.status, n.delivered_at, n.last_error = "delivered", now, None
            continue
        n.last_error = r.error
        if n.status != "pending":
            continue
        if n.attempts >= max_attempts:
            n.status = "failed"
            session.add(PageEvent(page_id=n.page_id, at=now, kind="notification-failed",
                                  message=f"{n.event} to {n.channel_name!r} failed "
                                  f"{n.attempts} times: {r.error}"))
        else:
            n.due_at = now + timedelta(seconds=backoff_s(n.attempts, base_s, cap_s))
