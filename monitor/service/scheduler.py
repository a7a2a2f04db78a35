"""The timer loop: escalations, notification deliveries and retries, label publication.

Started by the app's lifespan. Every ``poll_interval_s`` (or at once when a
request calls :meth:`Scheduler.wake`) it looks for due rows in the database,
so timers outlive the process: a restarted service simply finds them due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from monitor.service import notify, paging
from monitor.service.db import session_scope
from monitor.service.models import Alert, Verdict
from monitor.service.settings import PagingSettings
from streams.bus import Bus
from streams.processor import publish_record

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    escalated: int = 0
    delivered: int = 0
    failed_attempts: int = 0
    labels_published: int = 0


class Scheduler:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: PagingSettings,
        *,
        clock: Callable[[], datetime],
        console: TextIO,
        bus: Bus | None = None,
        labels_topic: str = "vigil.labels",
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.clock = clock
        self.console = console
        self.bus = bus
        self.labels_topic = labels_topic
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self.ticks = 0

    # --- control ---------------------------------------------------------------------

    def wake(self) -> None:
        """Look for due work now (thread-safe: called from request handlers)."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        async with httpx.AsyncClient(timeout=self.settings.webhook_timeout_s) as client:
            while not self._stopping:
                try:
                    await self.tick(client)
                except Exception:  # noqa: BLE001 - a database outage must not end the loop
                    log.exception("paging scheduler tick failed; retrying")
                self.ticks += 1
                if self._stopping:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
                self._wake.clear()

    # --- one pass ----------------------------------------------------------------------

    async def tick(self, client: httpx.AsyncClient) -> TickReport:
        report = TickReport()
        report.escalated = await asyncio.to_thread(self._escalate)
        while True:
            claimed = await asyncio.to_thread(self._claim)
            if not claimed:
                break
            results = await asyncio.gather(
                *(notify.deliver(client, d, self.console) for d in claimed)
            )
            await asyncio.to_thread(self._record, list(results))
            report.delivered += sum(r.ok for r in results)
            report.failed_attempts += sum(not r.ok for r in results)
            if len(claimed) < 100 or self._stopping:
                break
        if self.bus is not None:
            report.labels_published = await asyncio.to_thread(self._publish_labels)
        return report

    def _escalate(self) -> int:
        with session_scope(self.sessions) as session:
            return paging.escalate_due(session, now=self.clock(),
                                       base_url=self.settings.public_url)

    def _claim(self) -> list[notify.Delivery]:
        lease = self.settings.webhook_timeout_s + 30
        with session_scope(self.sessions) as session:
            return notify.claim_due(session, now=self.clock(), lease_s=lease)

    def _record(self, results: list[notify.DeliveryResult]) -> None:
        s = self.settings
        with session_scope(self.sessions) as session:
            notify.record_results(session, results, now=self.clock(),
                                  max_attempts=s.webhook_max_attempts,
                                  base_s=s.webhook_backoff_s, cap_s=s.webhook_backoff_max_s)

    def _publish_labels(self) -> int:
        """Publish unpublished verdicts: an outbox, stored first and published at least once.

        No database transaction is held while the broker acknowledges; a crash between the
        flush and the mark republishes (consumers drop repeats by ``vigil-idempotency-key``).
        """
        assert self.bus is not None
        with session_scope(self.sessions) as session:
            verdicts = session.scalars(
                select(Verdict).where(Verdict.published_at.is_(None)).order_by(Verdict.id)
                .limit(100)
            ).all()
            ids = [v.id for v in verdicts]
            records = [
                item
                for verdict in verdicts
                for item in paging.label_records(verdict, session.scalars(
                    select(Alert).where(Alert.page_id == verdict.page_id).order_by(Alert.id)
                ).all())
            ]
        if not ids:
            return 0
        for key, idempotency_key, record in records:
            publish_record(self.bus, self.labels_topic, record, key=key,
                           idempotency_key=idempotency_key)
        try:
            self.bus.flush()
        except Exception as e:  # noqa: BLE001 - DeliveryError or a client error: retry later
            log.warning("labels not acknowledged by the broker, will retry: %s", e)
            return 0
        with session_scope(self.sessions) as session:
            session.execute(
                update(Verdict).where(Verdict.id.in_(ids)).values(published_at=self.clock())
            )
        return len(records)
