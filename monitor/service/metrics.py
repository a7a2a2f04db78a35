"""``GET /metrics``: the paging service's Prometheus metrics, read from its database.

Read at scrape time, so every instance of the service on one database reports
the same numbers (aggregate with ``max``, not ``sum``) and a restart resets
nothing. Names (``dashboards.metrics``): ``vigil_pages{state}``,
``vigil_pages_opened_total``, ``vigil_page_verdicts_total{verdict}``,
``vigil_webhook_deliveries_total{ok}``. A page's every verdict counts (a
corrected verdict adds one), so the counters only grow.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from monitor.service.models import DeliveryAttempt, Page, Verdict

STATES = ("triggered", "acknowledged", "resolved")


class PagingCollector(Collector):
    """Counts pages, verdicts and webhook deliveries in the database at each scrape."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        with self.sessions() as s:
            by_state = {k: n for k, n in s.execute(
                select(Page.status, func.count()).group_by(Page.status))}
            opened = s.scalar(select(func.count()).select_from(Page)) or 0
            verdicts = {bool(k): n for k, n in s.execute(
                select(Verdict.harmful, func.count()).group_by(Verdict.harmful))}
            deliveries = {bool(k): n for k, n in s.execute(
                select(DeliveryAttempt.ok, func.count()).group_by(DeliveryAttempt.ok))}
        pages = GaugeMetricFamily("vigil_pages", "Pages by state now", labels=["state"])
        for state in sorted(set(STATES) | set(by_state)):
            pages.add_metric([state], by_state.get(state, 0))
        yield pages
        yield CounterMetricFamily("vigil_pages_opened", "Pages ever opened", value=opened)
        v = CounterMetricFamily("vigil_page_verdicts", "Human verdicts on pages",
                                labels=["verdict"])
        v.add_metric(["harmful"], verdicts.get(True, 0))
        v.add_metric(["benign"], verdicts.get(False, 0))
        yield v
        d = CounterMetricFamily("vigil_webhook_deliveries", "Webhook delivery attempts",
                                labels=["ok"])
        d.add_metric(["true"], deliveries.get(True, 0))
        d.add_metric(["false"], deliveries.get(False, 0))
        yield d


def add_metrics(app: FastAPI, sessions: sessionmaker[Session]) -> CollectorRegistry:
    """Serve ``GET /metrics`` from a registry of the app's own (no global registry)."""
    registry = CollectorRegistry()
    registry.register(PagingCollector(sessions))

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        token = request.app.state.settings.metrics_token
        if token is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), token.get_secret_value().encode()):
                return PlainTextResponse(
                    "GET /metrics needs 'Authorization: Bearer <VIGIL_PAGING_METRICS_TOKEN>'",
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)

    app.state.metrics = registry
    return registry
