"""The app factory: ``create_app(settings)`` builds the engine, the templates, the timer loop
and the routes. Nothing is built at import, so tests and the CLI build their own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import jinja2
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import text
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Match

from monitor.service.api.main import api_router
from monitor.service.db import make_engine, make_sessionmaker, upgrade_database, utcnow
from monitor.service.metrics import add_metrics
from monitor.service.paging import PagingError
from monitor.service.scheduler import Scheduler
from monitor.service.screen import ScreenQueue
from monitor.service.settings import PagingSettings
from monitor.service.web import routes as web
from streams.bus import Bus
from vigil.asgi import BodyLimit

if TYPE_CHECKING:
    from monitor.pipeline import Screener

log = logging.getLogger(__name__)

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "script-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[MutableMapping[str, Any]], Awaitable[None]]], Awaitable[None]]


def create_app(
    settings: PagingSettings | None = None,
    *,
    bus: Bus | None = None,
    console: TextIO | None = None,
    clock: Callable[[], datetime] = utcnow,
    screener: Screener | None = None,
) -> FastAPI:
    """Build the paging service.

    ``bus``: where verdicts are published (default: a ``KafkaBus`` when
    ``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` is set, else none: verdicts are stored
    and published once a bus is configured). ``console``: the console
    channel's stream (default stdout). ``screener``: answers ``POST /v1/screen``
    (default: loaded at start-up from ``settings.screen_policy`` when set, without the L2
    reviewer; with neither, the endpoint answers 503).
    """
    settings = settings or PagingSettings()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    secret = settings.secret_key.get_secret_value() if settings.secret_key else None
    if not secret:
        log.warning("VIGIL_PAGING_SECRET_KEY is not set: browser sessions end on restart")
        secret = secrets.token_urlsafe(32)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            await asyncio.to_thread(upgrade_database, engine)
        if app.state.screen is None and settings.screen_policy is not None:
            app.state.screen = await _load_screen(settings)
        own_bus, labels_topic = _labels_bus(settings, bus)
        app.state.bus = own_bus or bus
        scheduler = Scheduler(sessions, settings, clock=clock, console=console or sys.stdout,
                              bus=app.state.bus, labels_topic=labels_topic)
        app.state.scheduler = scheduler
        task = asyncio.create_task(scheduler.run(), name="vigil-paging-scheduler")
        try:
            yield
        finally:
            scheduler.stop()
            try:
                await asyncio.wait_for(task, timeout=settings.webhook_timeout_s + 5)
            except TimeoutError:
                task.cancel()
            app.state.scheduler = None
            if own_bus is not None:
                await asyncio.to_thread(own_bus.close)
            engine.dispose()

    app = FastAPI(
        title="vigil paging service",
        version="1",
        summary="L3: page on-call reviewers about the worst agent steps, and take their verdicts.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.clock = clock
    app.state.bus = bus
    app.state.scheduler = None
    app.state.screen = (_screen_queue(screener, settings) if screener is not None else None)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True)
    app.state.templates = Jinja2Templates(env=env)

    app.include_router(api_router())
    app.include_router(web.router)
    _add_health(app)
    add_metrics(app, sessions)
    _add_error_handlers(app)
    app.add_middleware(SessionMiddleware, secret_key=secret, session_cookie="vigil_session",
                       max_age=settings.session_max_age_s, same_site="lax",
                       https_only=settings.secure_cookies)
    app.add_middleware(_Guard, max_body_bytes=settings.max_body_bytes,
                       limits={path: (settings.screen_max_body_bytes,
                                      "VIGIL_PAGING_SCREEN_MAX_BODY_BYTES")
                               for path in ("/v1/screen", "/v1/hooks/claude-code")})
    return app


def _screen_queue(screener: Screener, settings: PagingSettings) -> ScreenQueue:
    return ScreenQueue(screener, max_batch=settings.screen_max_batch,
                       batch_chars=settings.screen_batch_chars)


async def _load_screen(settings: PagingSettings) -> ScreenQueue:
    """The screener of ``settings.screen_policy`` (L0 + L1), warmed up by one check so that
    the first request does not wait for lazily loaded models (seconds, once)."""
    from monitor.pipeline import load_screener
    from streams.records import Action, Trajectory

    path = settings.screen_policy

    def load() -> Screener:
        screener = load_screener(path, reviewer=False, log=log.info)
        screener.check_action(Trajectory(trajectory_id="warm-up", steps=[]),
                              Action(text="warm up"))
        return screener

    t0 = asyncio.get_running_loop().time()
    screener = await asyncio.to_thread(load)
    queue = _screen_queue(screener, settings)
    log.info("POST /v1/screen: policy %s (%s) loaded in %.1f s", path, queue.policy,
             asyncio.get_running_loop().time() - t0)
    return queue


def _labels_bus(settings: PagingSettings, given: Bus | None) -> tuple[Bus | None, str]:
    """A KafkaBus this app owns (or None), and the labels topic."""
    from streams.config import KafkaSettings, Topics

    topic = settings.labels_topic or Topics().labels
    if given is not None or not settings.publish_labels:
        return None, topic
    kafka = KafkaSettings()
    if not kafka.bootstrap_servers:
        log.warning("no Kafka configured (VIGIL_KAFKA_BOOTSTRAP_SERVERS): verdicts are stored "
                    "but not published to %s", topic)
        return None, topic
    from streams.kafka import KafkaBus

    return KafkaBus(kafka), topic


def _add_health(app: FastAPI) -> None:
    @app.get("/healthz", tags=["health"], summary="Liveness and database reachability")
    def healthz(request: Request) -> dict[str, Any]:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        scheduler = request.app.state.scheduler
        return {"status": "ok", "scheduler_ticks": scheduler.ticks if scheduler else None}


def _first_error(errors: list[Any]) -> str:
    if not errors:
        return "invalid request"
    err = errors[0]
    loc = list(err.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    where = ".".join(str(p) for p in loc)
    msg = str(err.get("msg", "is invalid")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if err.get("type") == "missing":
        msg = "required, but missing"
    elif err.get("type") == "extra_forbidden":
        msg = "unknown field"
    return f"invalid request: {where + ': ' if where else ''}{msg}{more}"


def _wants_html(request: Request) -> bool:
    path = request.url.path
    return not path.startswith(("/api/", "/v1/")) and path not in ("/healthz", "/metrics")


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()
        ]
        return JSONResponse({"detail": _first_error(errors), "errors": errors},
                            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(PagingError)
    async def paging_error(request: Request, exc: PagingError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)

    @app.exception_handler(web.LoginRequired)
    async def login_required(request: Request, exc: web.LoginRequired) -> Response:
        if request.method in ("GET", "HEAD"):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={_quote(target)}", status.HTTP_303_SEE_OTHER)
        return _html_error(request, status.HTTP_401_UNAUTHORIZED, "Sign in first",
                           "This action needs a signed-in reviewer.")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            # the router names the methods of one route; a path can have a route per method
            headers["Allow"] = ", ".join(_allowed_methods(request)) or headers.get("Allow", "")
        if _wants_html(request) and exc.status_code in (403, 404, 405):
            page = _html_error(request, exc.status_code, "Not allowed" if exc.status_code == 403
                               else "Not found", str(exc.detail))
            page.headers.update(headers)
            return page
        detail = exc.detail
        if detail == "There was an error parsing the body":
            detail = "the request body is not valid JSON (UTF-8)"
        return JSONResponse({"detail": detail}, status_code=exc.status_code,
                            headers=headers or None)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes at the request's path."""
    routes = request.app.router.routes
    return [m for m in _METHODS
            if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes)]


def _quote(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/")


def _html_error(request: Request, code: int, title: str, message: str) -> HTMLResponse:
    templates = request.app.state.templates
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request, "error.html",
        {"user": None, "csrf": "", "flashes": [], "title": title, "message": message,
         "link": "/login", "link_text": "Sign in"},
        status_code=code,
    )


class _Guard:
    """Refuses bodies over the limit (413, before the body is read or parsed:
    :class:`vigil.asgi.BodyLimit`) and adds security headers to every response, the 413 too.
    ``limits``: a tighter limit for some paths, with the setting that changes it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 limits: Mapping[str, tuple[int, str]] | None = None) -> None:
        self.app = BodyLimit(app, max_body_bytes, setting="VIGIL_PAGING_MAX_BODY_BYTES",
                             limits=limits, who="service")

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope["path"] in ("/docs", "/redoc") or scope["path"].startswith("/docs/")

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"same-origin"))
                if not docs:
                    headers.append((b"content-security-policy", _CSP.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
