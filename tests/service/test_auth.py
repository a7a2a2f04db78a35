"""Every mutating route refuses requests without a token (401) and with the wrong role (403);
tokens are stored hashed; the browser pages need a session and a CSRF token."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import select

from monitor.service.db import make_engine, make_sessionmaker
from monitor.service.models import ApiToken
from tests.service.conftest import Service
from tests.service.helpers import trigger

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
# who may call each mutating API route (admin may call all of them)
ALLOWED: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/pages/{page_id}/acknowledge"): "reviewer",
    ("POST", "/api/v1/pages/{page_id}/resolve"): "reviewer",
    ("POST", "/api/v1/verdicts"): "reviewer",
    ("POST", "/api/v1/silences"): "reviewer",
    ("DELETE", "/api/v1/silences/{silence_id}"): "reviewer",
    ("POST", "/api/v1/policies"): "admin",
    ("PUT", "/api/v1/policies/{name}"): "admin",
    ("DELETE", "/api/v1/policies/{name}"): "admin",
    ("POST", "/api/v1/channels"): "admin",
    ("DELETE", "/api/v1/channels/{name}"): "admin",
    ("POST", "/api/v1/tokens"): "admin",
    ("DELETE", "/api/v1/tokens/{token_id}"): "admin",
    ("POST", "/v1/screen"): "producer",  # the agent's harness, before an action runs
    ("POST", "/v1/hooks/claude-code"): "producer",  # the same, as a Claude Code hook
    ("POST", "/v1/traces"): "producer",  # an agent's OTLP exporter: its tool spans as steps
}
API_PREFIXES = ("/api/", "/v1/")
EVENTS = ("POST", "/api/v1/events")  # the role depends on the action: tested on its own
WEB_MUTATING = {"/logout", "/cases/{page_id}/acknowledge", "/cases/{page_id}/resolve",
                "/cases/{page_id}/verdict"}
PATH_VALUES = {"page_id": "1", "silence_id": "1", "name": "default", "token_id": "1"}


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path)


def all_routes(app: Any) -> list[tuple[str, APIRoute]]:
    """(path, route) of every API route, through included routers (FastAPI >= 0.130 keeps
    them nested; older versions flatten them into ``app.routes``)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return [(r.path, r) for r in app.routes if isinstance(r, APIRoute)]
    return [(str(c.path), c.original_route) for c in iter_route_contexts(app.routes)
            if isinstance(c.original_route, APIRoute)]


def mutating_routes(client: TestClient) -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, route in all_routes(client.app)
        for method in route.methods & MUTATING
    }


def test_every_mutating_api_route_refuses_missing_bad_and_wrong_role_tokens(
    client: TestClient, service: Service
) -> None:
    routes = mutating_routes(client)
    api = {r for r in routes if r[1].startswith(API_PREFIXES)}
    assert api == set(ALLOWED) | {EVENTS}, "a new mutating route needs an entry in ALLOWED"
    for method, path in sorted(api):
        url = concrete(path)
        r = client.request(method, url, json={})
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "missing API token" in r.json()["detail"]
        r = client.request(method, url, json={}, headers={"Authorization": "Bearer vgl_nope"})
        assert r.status_code == 401, (method, path)
        r = client.request(method, url, json={}, headers={"Authorization": "Basic YTpi"})
        assert r.status_code == 401, (method, path)
        if (method, path) == EVENTS:
            continue
        allowed = ALLOWED[method, path]
        for role in ("producer", "reviewer", "admin"):
            if role in (allowed, "admin"):
                continue
            r = client.request(method, url, json={}, headers=service.auth(role))
            assert r.status_code == 403, (method, path, role, r.text)
            assert f"has role '{role}'" in r.json()["detail"]


def test_events_roles_follow_the_action(client: TestClient, service: Service) -> None:
    event = trigger("traj-roles", 0)
    assert client.post("/api/v1/events", json=event,
                       headers=service.auth("reviewer")).status_code == 403
    assert client.post("/api/v1/events", json=event,
                       headers=service.auth("producer")).status_code == 202
    for action in ("acknowledge", "resolve"):
        body = {"event_action": action, "dedup_key": "traj-roles/s0"}
        r = client.post("/api/v1/events", json=body, headers=service.auth("producer"))
        assert r.status_code == 403
        assert f"an {action} event needs 'reviewer'" in r.json()["detail"]
    assert client.post("/api/v1/events", json={"event_action": "resolve",
                                                "dedup_key": "traj-roles/s0"},
                       headers=service.auth("admin")).status_code == 202


def test_tokens_are_hashed_at_rest_and_revocable(client: TestClient, service: Service) -> None:
    r = client.post("/api/v1/tokens", json={"name": "bob", "role": "reviewer"},
                    headers=service.auth("admin"))
    assert r.status_code == 201
    created = r.json()
    token = created["token"]
    assert token.startswith("vgl_") and len(token) > 40
    listed = client.get("/api/v1/tokens", headers=service.auth("admin")).json()
    assert all("token" not in t for t in listed)
    engine = make_engine(service.url)
    with make_sessionmaker(engine)() as session:
        rows = session.scalars(select(ApiToken)).all()
        stored = " ".join(f"{t.name} {t.token_hash} {t.prefix}" for t in rows)
        assert token not in stored
        row = next(t for t in rows if t.id == created["id"])
        assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    engine.dispose()
    bob = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/auth/me", headers=bob).json() == {"name": "bob",
                                                                 "role": "reviewer"}
    assert client.delete(f"/api/v1/tokens/{created['id']}",
                         headers=service.auth("admin")).status_code == 200
    r = client.get("/api/v1/auth/me", headers=bob)
    assert r.status_code == 401
    assert r.json()["detail"] == "invalid or revoked API token"


def sign_in(client: TestClient, token: str) -> int:
    r = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    return r.status_code


def test_review_pages_need_a_session_and_a_csrf_token(client: TestClient,
                                                      service: Service) -> None:
    client.post("/api/v1/events", json=trigger("traj-web", 0), headers=service.auth("producer"))
    web = {path for method, path in mutating_routes(client) if not path.startswith(API_PREFIXES)}
    assert web - {"/login"} == WEB_MUTATING
    for path in sorted(WEB_MUTATING):
        r = client.post(concrete(path), data={"csrf": "x", "harmful": "yes"},
                        follow_redirects=False)
        assert r.status_code == 401, path
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/"

    assert sign_in(client, "vgl_wrong") == 401
    assert sign_in(client, service.tokens["producer"]) == 403  # agents' side never signs in
    assert sign_in(client, service.tokens["reviewer"]) == 303
    assert client.get("/", follow_redirects=False).status_code == 200
    for path in sorted(WEB_MUTATING):
        r = client.post(concrete(path), data={"csrf": "forged", "harmful": "yes"},
                        follow_redirects=False)
        assert r.status_code == 403, path
    page = client.get("/api/v1/pages/1", headers=service.auth("reviewer")).json()
    assert page["status"] == "triggered" and page["verdicts"] == []


@pytest.mark.parametrize("next_url", ["//evil.example/", "https://evil.example/"])
def test_login_never_redirects_off_site(client: TestClient, service: Service,
                                        next_url: str) -> None:
    r = client.post("/login", data={"token": service.tokens["reviewer"], "next": next_url},
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"


def test_metrics_need_a_reviewer_admin_or_metrics_token_and_never_a_producers(
    client: TestClient, service: Service
) -> None:
    """The metrics count verdicts: no route may show a verdict to a producer."""
    client.post("/api/v1/events", json=trigger("traj-m", 0), headers=service.auth("producer"))
    for headers in ({}, {"Authorization": "Bearer vgl_unknown"}, {"Authorization": "Basic x"}):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and "VIGIL_PAGING_METRICS_TOKEN" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert "vigil_page_verdicts" not in r.text
    r = client.get("/metrics", headers=service.auth("producer"))
    assert r.status_code == 403 and "vigil_page_verdicts" not in r.text
    assert r.json()["detail"] == ("token 'producer-1' has role 'producer'; GET /metrics needs "
                                  "'reviewer' or 'admin' (or the service's "
                                  "VIGIL_PAGING_METRICS_TOKEN)")
    for role in ("reviewer", "admin"):
        r = client.get("/metrics", headers=service.auth(role))
        assert r.status_code == 200 and "vigil_pages_opened_total 1.0" in r.text

    with TestClient(service.app(metrics_token="scrape-me")) as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic scrape-me"}):
            r = guarded.get("/metrics", headers=headers)
            assert r.status_code == 401 and "VIGIL_PAGING_METRICS_TOKEN" in r.text
            assert r.headers["www-authenticate"] == "Bearer"
        r = guarded.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert r.status_code == 200 and "vigil_pages_opened_total 1.0" in r.text
        assert guarded.get("/metrics", headers=service.auth("reviewer")).status_code == 200
        assert guarded.get("/metrics", headers=service.auth("producer")).status_code == 403

    with TestClient(service.app(metrics_open=True)) as open_:  # the explicit opt-in
        r = open_.get("/metrics")
        assert r.status_code == 200 and "vigil_page_verdicts_total" in r.text
