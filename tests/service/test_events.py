"""The events API on both stores: triggers open, group and deduplicate pages; acknowledge and
resolve; bad input is one clear 4xx."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from tests.service.conftest import Service
from tests.service.helpers import trigger


def pages(client: TestClient, service: Service, status: str = "all") -> list[dict[str, Any]]:
    r = client.get("/api/v1/pages", params={"status": status}, headers=service.auth("reviewer"))
    assert r.status_code == 200, r.text
    return r.json()["items"]  # type: ignore[no-any-return]


def send(client: TestClient, service: Service, event: dict[str, Any], role: str = "producer"
         ) -> Any:
    return client.post("/api/v1/events", json=event, headers=service.auth(role))


def test_trigger_opens_a_page_with_the_case_data(client: TestClient, service: Service) -> None:
    r = send(client, service, trigger("traj-a", 2))
    assert r.status_code == 202
    assert r.json() == {"status": "success", "message": "Event processed: page opened",
                        "dedup_key": "traj-a/s2"}
    [page] = pages(client, service)
    assert (page["status"], page["severity"], page["trajectory_id"]) == (
        "triggered", "critical", "traj-a")
    detail = client.get(f"/api/v1/pages/{page['id']}", headers=service.auth("reviewer")).json()
    [alert] = detail["alerts"]
    assert alert["step_id"] == "s2"
    assert len(alert["details"]["trajectory"]["steps"]) == 3
    assert [s["tier"] for s in alert["details"]["scores"]] == [0, 1, 2]
    assert alert["details"]["rubric"]["verdict"] == "harmful"


def test_redelivered_triggers_make_one_page(client: TestClient, service: Service) -> None:
    event = trigger("traj-dup", 1)
    replies = [send(client, service, event) for _ in range(5)]
    assert [r.status_code for r in replies] == [202] * 5
    assert "duplicate" in replies[-1].json()["message"]
    [page] = pages(client, service)
    assert (page["alert_count"], page["trigger_count"]) == (1, 5)


def test_concurrent_duplicate_triggers_make_one_page(client: TestClient, service: Service) -> None:
    """Eight threads deliver the same trigger at once (a worker's redelivery storm)."""
    event = trigger("traj-race", 0)
    barrier = threading.Barrier(8)
    codes: list[int] = []

    def deliver() -> None:
        barrier.wait()
        codes.append(send(client, service, event).status_code)

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [202] * 8
    [page] = pages(client, service)
    assert (page["alert_count"], page["trigger_count"]) == (1, 8)


def test_a_trigger_after_resolve_never_reopens(client: TestClient, service: Service) -> None:
    send(client, service, trigger("traj-r", 0))
    r = send(client, service, {"event_action": "resolve", "dedup_key": "traj-r/s0"}, "reviewer")
    assert r.status_code == 202
    assert send(client, service, trigger("traj-r", 0)).status_code == 202  # a late redelivery
    [page] = pages(client, service)
    assert page["status"] == "resolved"
    assert pages(client, service, "open") == []


def test_steps_of_one_trajectory_group_into_one_page(client: TestClient, service: Service) -> None:
    for step in (1, 3, 4):
        r = send(client, service, trigger("traj-g", step, severity="warning"))
        assert r.status_code == 202
    r = send(client, service, trigger("traj-g", 5, severity="critical"))
    assert "added to the open page" in r.json()["message"]
    send(client, service, trigger("traj-other", 0, severity="info"))
    by_traj = {p["trajectory_id"]: p for p in pages(client, service)}
    assert by_traj["traj-g"]["alert_count"] == 4
    assert by_traj["traj-g"]["severity"] == "critical"  # raised by the worse alert
    assert by_traj["traj-other"]["alert_count"] == 1


def test_trajectories_of_one_execution_group_together(client: TestClient,
                                                      service: Service) -> None:
    send(client, service, trigger("leaf-1", 0, execution_id="exec-9"))
    send(client, service, trigger("leaf-2", 1, execution_id="exec-9"))
    [page] = pages(client, service)
    assert page["execution_id"] == "exec-9"
    assert page["alert_count"] == 2


def test_open_queue_is_ordered_by_severity_then_age(client: TestClient, service: Service) -> None:
    for tid, sev in [("q1", "info"), ("q2", "critical"), ("q3", "warning"), ("q4", "critical")]:
        send(client, service, trigger(tid, severity=sev))
    assert [p["trajectory_id"] for p in pages(client, service, "open")] == ["q2", "q4", "q3", "q1"]


def test_acknowledge_and_resolve_by_event_and_by_page(client: TestClient,
                                                      service: Service) -> None:
    send(client, service, trigger("traj-ack", 0))
    r = send(client, service, {"event_action": "acknowledge", "dedup_key": "traj-ack/s0"},
             "reviewer")
    assert r.status_code == 202
    [page] = pages(client, service)
    assert page["status"] == "acknowledged"
    assert page["acknowledged_by"] == "reviewer-1"
    assert page["next_escalation_at"] is None
    again = client.post(f"/api/v1/pages/{page['id']}/acknowledge",
                        headers=service.auth("reviewer"))
    assert again.status_code == 200  # idempotent
    done = client.post(f"/api/v1/pages/{page['id']}/resolve", headers=service.auth("reviewer"))
    assert done.json()["status"] == "resolved"
    late = client.post(f"/api/v1/pages/{page['id']}/acknowledge",
                       headers=service.auth("reviewer"))
    assert late.status_code == 409
    assert late.json()["detail"] == f"page {page['id']} is already resolved"


def test_a_producer_reads_what_became_of_its_trigger(client: TestClient,
                                                    service: Service) -> None:
    """``GET /api/v1/events/{dedup_key}``: pending until a reviewer answers; a verdict
    "not harmful" approves, "harmful" rejects, a page resolved without one rejects."""

    def decision(key: str, role: str = "producer") -> Any:
        return client.get(f"/api/v1/events/{key}", headers=service.auth(role))

    keys = []
    for tid in ("held-ok", "held-bad", "held-closed"):
        send(client, service, {**trigger(tid), "payload": {
            **trigger(tid)["payload"], "group": f"{tid}/s0"}})
        keys.append(f"{tid}/s0")
    got = decision(keys[0])
    assert got.status_code == 200, got.text
    assert got.json()["decision"] == "pending" and got.json()["page_status"] == "triggered"
    assert decision(keys[0], "reviewer").json()["decision"] == "pending"  # reviewers may read
    page = {k: decision(k).json()["page_id"] for k in keys}
    assert len(set(page.values())) == 3  # each its own case
    r = client.post("/api/v1/verdicts", headers=service.auth("reviewer"), json={
        "page_id": page[keys[0]], "harmful": False, "note": "expected"})
    assert r.status_code == 201, r.text
    assert decision(keys[0]).json() | {"page_id": 0} == {
        "dedup_key": keys[0], "page_id": 0, "page_status": "resolved", "decision": "approved",
        "reviewer": "reviewer-1", "note": "expected"}
    client.post("/api/v1/verdicts", headers=service.auth("reviewer"), json={
        "page_id": page[keys[1]], "harmful": True, "note": "wires the savings away"})
    bad = decision(keys[1]).json()
    assert (bad["decision"], bad["note"]) == ("rejected", "wires the savings away")
    client.post(f"/api/v1/pages/{page[keys[2]]}/resolve", headers=service.auth("reviewer"))
    assert decision(keys[2]).json()["decision"] == "rejected"
    missing = decision("nobody/s9")
    assert missing.status_code == 404 and "nobody/s9" in missing.json()["detail"]
    assert client.get(f"/api/v1/events/{keys[0]}").status_code == 401


def test_bad_events_get_one_clear_4xx(client: TestClient, service: Service) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"event_action": "trigger", "dedup_key": "x"}, 422, "a trigger event needs a payload"),
        ({"event_action": "acknowledge"}, 422, "needs the dedup_key"),
        ({"event_action": "explode", "dedup_key": "x"}, 422, "event_action"),
        ({**trigger("t"), "routing_key": "nobody"}, 400, "unknown routing_key 'nobody'"),
        ({"event_action": "resolve", "dedup_key": "never/sent"}, 404, "never/sent"),
    ]
    bad_step = trigger("t")
    bad_step["payload"]["custom_details"]["step_id"] = "s9"
    cases.append((bad_step, 422, "step_id 's9' is not a step of trajectory 't'"))
    bad_sev = trigger("t")
    bad_sev["payload"]["severity"] = "apocalyptic"
    cases.append((bad_sev, 422, "payload.severity"))
    no_action = trigger("t")
    del no_action["payload"]["custom_details"]["trajectory"]["steps"][0]["action"]
    cases.append((no_action, 422, "trajectory.steps.0.action: required, but missing"))
    nul = trigger("t", summary="zero\x00byte")
    cases.append((nul, 422, "NUL"))
    deep = trigger("t")
    nested: list[Any] = []
    for _ in range(500):  # deep enough to break a serialiser, well within the JSON parser
        nested = [nested]
    deep["payload"]["custom_details"]["extra"] = nested
    cases.append((deep, 422, "nests deeper than 64 levels"))
    for event, code, reason in cases:
        role = "producer" if event["event_action"] == "trigger" else "reviewer"
        r = send(client, service, event, role)
        assert r.status_code == code, (event, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and reason in detail, (reason, detail)
    assert pages(client, service) == []
    r = client.post("/api/v1/events", content=b"{not json", headers={
        **service.auth("producer"), "Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("invalid request: ")


def test_oversized_bodies_are_refused(service: Service) -> None:
    with TestClient(service.app(max_body_bytes=4096)) as client:
        r = send(client, service, trigger("big", 0, n_steps=60))
        assert r.status_code == 413
        assert "limit of 4096 bytes" in r.json()["detail"]


def test_producers_cannot_read_pages_or_verdicts(client: TestClient, service: Service) -> None:
    """A verdict is never shown to the monitored agent: its token reads nothing back."""
    send(client, service, trigger("traj-secret", 0))
    for path in ("/api/v1/pages", "/api/v1/pages/1", "/api/v1/verdicts",
                 "/api/v1/pages/1/notifications", "/metrics"):
        r = client.get(path, headers=service.auth("producer"))
        assert r.status_code == 403, path
