"""The review pages: sign in, the queue, a case, the recall plots.

Browsers sign in with an API token (reviewer or admin) once; a signed session
cookie carries them after that, and every form carries a CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Path, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from monitor.service import auth, paging
from monitor.service.deps import NowDep, SchedulerDep, SessionDep, SettingsDep
from monitor.service.models import SEVERITIES, Page
from monitor.service.scheduler import Scheduler
from monitor.service.schemas import MAX_ID, VerdictCreate
from monitor.service.web import recall
from monitor.service.web.views import age, case_view

router = APIRouter(include_in_schema=False)

CATEGORIES = (
    "data exfiltration",
    "destructive action",
    "credential access",
    "prompt injection followed",
    "deception",
    "policy violation",
    "other",
)


class LoginRequired(Exception):
    """No valid browser session: GETs go to the login page, form posts get 401."""


def web_principal(request: Request, session: SessionDep) -> auth.Principal:
    token_id = request.session.get("token_id")
    principal = auth.principal_for_id(session, token_id) if isinstance(token_id, int) else None
    if principal is None or not principal.may("reviewer"):
        request.session.clear()
        raise LoginRequired()
    return principal


WebReviewerDep = Annotated[auth.Principal, Depends(web_principal)]


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(24)
        request.session["csrf"] = token
    return token


def checked_form(
    request: Request, principal: WebReviewerDep, csrf: Annotated[str, Form()] = ""
) -> auth.Principal:
    """A signed-in reviewer whose form came from one of our pages."""
    expected = request.session.get("csrf")
    if not isinstance(expected, str) or not hmac.compare_digest(csrf, expected):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "the form expired or did not come from vigil: reload and try again")
    return principal


FormReviewerDep = Annotated[auth.Principal, Depends(checked_form)]
CaseId = Annotated[int, Path(ge=1, le=MAX_ID)]


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200
           ) -> HTMLResponse:
    templates = request.app.state.templates
    flashes = request.session.pop("flash", []) if "session" in request.scope else []
    base = {"csrf": csrf_token(request), "flashes": flashes, "severities": SEVERITIES}
    return templates.TemplateResponse(request, name, {**base, **context},  # type: ignore[no-any-return]
                                      status_code=status_code)


def flash(request: Request, message: str) -> None:
    request.session["flash"] = [*request.session.get("flash", []), message]


def _safe_next(value: str | None) -> str:
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


# --- sign in and out ---------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> HTMLResponse:
    return render(request, "login.html", {"next": _safe_next(next), "error": None, "user": None})


@router.post("/login", response_model=None)
def login(
    request: Request,
    session: SessionDep,
    now: NowDep,
    token: Annotated[str, Form(max_length=500)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    principal = auth.authenticate(session, token.strip(), now=now) if token.strip() else None
    if principal is None:
        return render(request, "login.html", {"next": _safe_next(next), "user": None,
                                              "error": "That token is unknown or revoked."},
                      status.HTTP_401_UNAUTHORIZED)
    if not principal.may("reviewer"):
        return render(request, "login.html", {
            "next": _safe_next(next), "user": None,
            "error": f"Token {principal.name!r} has role {principal.role!r}: only reviewers "
                     "and admins may sign in to the review pages."},
            status.HTTP_403_FORBIDDEN)
    session.commit()
    request.session.clear()
    request.session["token_id"] = principal.token_id
    request.session["csrf"] = secrets.token_urlsafe(24)
    return RedirectResponse(_safe_next(next), status.HTTP_303_SEE_OTHER)


@router.post("/logout")
def logout(request: Request, _: FormReviewerDep) -> RedirectResponse:
    request.session.clear()
    return RedirectResponse("/login", status.HTTP_303_SEE_OTHER)


# --- the queue and a case ----------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def queue(request: Request, session: SessionDep, user: WebReviewerDep, now: NowDep) -> HTMLResponse:
    total, pages = paging.list_pages(session, status="open", limit=500)
    rows = [{"page": p, "age": age(p.opened_at, now)} for p in pages]
    return render(request, "queue.html", {"user": user, "rows": rows, "total": total})


@router.get("/cases/{page_id}", response_class=HTMLResponse)
def case(
    request: Request, page_id: CaseId, session: SessionDep, user: WebReviewerDep, now: NowDep
) -> HTMLResponse:
    page = session.get(Page, page_id)
    if page is None:
        return render(request, "error.html", {"user": user, "title": "No such case",
                                              "message": f"There is no case {page_id}."},
                      status.HTTP_404_NOT_FOUND)
    return render(request, "case.html", {
        "user": user, "page": page, "view": case_view(page), "age": age(page.opened_at, now),
        "categories": CATEGORIES,
    })


def _act(
    request: Request, session: Session, scheduler: Scheduler | None,
    act: Callable[[], object], done: str,
) -> None:
    """Run one paging action for the form user, flash what happened, wake the timers."""
    try:
        act()
        session.commit()
        flash(request, done)
    except paging.PagingError as e:
        session.rollback()
        flash(request, str(e))
    if scheduler is not None:
        scheduler.wake()


@router.post("/cases/{page_id}/acknowledge")
def acknowledge(
    request: Request, page_id: CaseId, session: SessionDep, user: FormReviewerDep,
    settings: SettingsDep, now: NowDep, scheduler: SchedulerDep,
) -> RedirectResponse:
    _act(request, session, scheduler,
         lambda: paging.acknowledge(session, page_id, user.name, now=now,
                                    base_url=settings.public_url),
         f"Case {page_id} acknowledged: escalation stopped.")
    return RedirectResponse(f"/cases/{page_id}", status.HTTP_303_SEE_OTHER)


@router.post("/cases/{page_id}/resolve")
def resolve(
    request: Request, page_id: CaseId, session: SessionDep, user: FormReviewerDep,
    settings: SettingsDep, now: NowDep, scheduler: SchedulerDep,
) -> RedirectResponse:
    _act(request, session, scheduler,
         lambda: paging.resolve(session, page_id, user.name, now=now,
                                base_url=settings.public_url),
         f"Case {page_id} resolved without a label.")
    return RedirectResponse("/", status.HTTP_303_SEE_OTHER)


@router.post("/cases/{page_id}/verdict")
def label(
    request: Request,
    page_id: CaseId,
    session: SessionDep,
    user: FormReviewerDep,
    settings: SettingsDep,
    now: NowDep,
    scheduler: SchedulerDep,
    harmful: Annotated[str, Form()] = "",
    category: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
) -> RedirectResponse:
    if harmful not in ("yes", "no"):
        flash(request, "Choose harmful or not harmful before saving the verdict.")
        return RedirectResponse(f"/cases/{page_id}", status.HTTP_303_SEE_OTHER)
    try:
        verdict = VerdictCreate(page_id=page_id, harmful=harmful == "yes",
                                category=category.strip() or None, note=note.strip())
        paging.record_verdict(session, verdict, user.name, now=now, base_url=settings.public_url)
        session.commit()
    except ValidationError as e:
        flash(request, f"Verdict not saved: {e.errors()[0]['msg']}.")
        return RedirectResponse(f"/cases/{page_id}", status.HTTP_303_SEE_OTHER)
    except paging.PagingError as e:
        session.rollback()
        flash(request, str(e))
        return RedirectResponse("/", status.HTTP_303_SEE_OTHER)
    if scheduler is not None:
        scheduler.wake()
    flash(request, f"Case {page_id} labelled {'harmful' if verdict.harmful else 'not harmful'}"
                   " and resolved.")
    return RedirectResponse("/", status.HTTP_303_SEE_OTHER)


# --- recall ---------------------------------------------------------------------------------------


@router.get("/recall", response_class=HTMLResponse)
def recall_page(
    request: Request, session: SessionDep, user: WebReviewerDep, now: NowDep
) -> HTMLResponse:
    report = recall.recall_report(session, now=now)
    return render(request, "recall.html", {"user": user, "report": report,
                                           "tier_names": recall.TIER_NAMES,
                                           "publishing": request.app.state.bus is not None})


@router.get("/recall.png")
def recall_png(session: SessionDep, _: WebReviewerDep, now: NowDep) -> Response:
    png = recall.render_png(recall.recall_report(session, now=now))
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})
