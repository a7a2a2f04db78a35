"""``GET /metrics``: the paging service's Prometheus metrics, read from its database.

Read at scrape time, so every instance of the service on one database reports
the same numbers (aggregate with ``max``, not ``sum``) and a restart resets
nothing. Names (``dashboards.metrics``): ``vigil_pages{state}``,
``vigil_pages_opened_total``, ``vigil_page_verdicts_total{verdict}``,
``vigil_webhook_deliveries_total{ok}``. A page's every verdict counts (a
corrected verdict adds one), so the counters only grow.

The verdict counts would tell a producer how its pages were judged, so the route
needs a token: ``VIGIL_PAGING_METRICS_TOKEN`` (a scrape-only secret) or a reviewer or
admin API token; a producer's gets 403, none 401. ``VIGIL_PAGING_METRICS_OPEN=true``
serves it to anyone (for a scrape network no producer can reach).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from monitor.service.auth import authenticate
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
        settings = request.app.state.settings
        if not settings.metrics_open:
            check_scraper(request, settings.metrics_token)
        return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)

    app.state.metrics = registry
    return registry


NEEDS_TOKEN = ("GET /metrics needs 'Authorization: Bearer <token>': the service's "
               "VIGIL_PAGING_METRICS_TOKEN, or a reviewer or admin API token")


def check_scraper(request: Request, metrics_token: SecretStr | None) -> None:
    """Let the metrics token, a reviewer or an admin through; 401 without a valid token, 403
    for a producer's (the metrics count verdicts, which a producer must never see)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, NEEDS_TOKEN,
                            headers={"WWW-Authenticate": "Bearer"})
    if metrics_token is not None and hmac.compare_digest(
            given.encode(), metrics_token.get_secret_value().encode()):
        return
    with request.app.state.sessions() as session:
        principal = authenticate(session, given, now=request.app.state.clock())
        session.commit()  # last_used_at
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, f"{NEEDS_TOKEN}; this one is unknown "
                            "or revoked", headers={"WWW-Authenticate": "Bearer"})
    if not principal.may("reviewer"):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"token {principal.name!r} has role {principal.role!r}; GET /metrics needs "
            "'reviewer' or 'admin' (or the service's VIGIL_PAGING_METRICS_TOKEN)")
