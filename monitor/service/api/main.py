"""All API routers under one."""

from __future__ import annotations

from fastapi import APIRouter

from monitor.service.api.routes import (
    auth,
    channels,
    events,
    hooks,
    otlp,
    pages,
    policies,
    screen,
    silences,
    verdicts,
)


def api_router() -> APIRouter:
    router = APIRouter()
    for module in (events, pages, verdicts, policies, channels, silences, auth, screen,
                   hooks, otlp):
        router.include_router(module.router)
    return router
