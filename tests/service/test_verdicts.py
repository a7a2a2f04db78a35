"""Verdicts: a reviewer labels a case, it leaves the queue, labels go to the labels topic
(in-process bus on both stores; a real Kafka broker once), and the recall page plots them."""

from __future__ import annotations

import io
import struct
import time

import pytest
from fastapi.testclient import TestClient

from monitor.service.app import create_app
from streams.config import KafkaSettings
from streams.kafka import KafkaBus
from streams.processor import H_IDEMPOTENCY
from streams.records import LabelRecord, decode
from tests.service.conftest import Service
from tests.service.helpers import trigger, wait_for


def open_pages(client: TestClient, service: Service) -> list[int]:
    r = client.get("/api/v1/pages", headers=service.auth("reviewer"))
    return [p["id"] for p in r.json()["items"]]


def test_verdict_resolves_the_case_and_publishes_a_label_per_flagged_step(
    client: TestClient, service: Service
) -> None:
    for step in (1, 2):
        client.post("/api/v1/events", json=trigger("traj-v", step, n_steps=3),
                    headers=service.auth("producer"))
    assert open_pages(client, service) == [1]
    r = client.post("/api/v1/verdicts", headers=service.auth("reviewer"), json={
        "page_id": 1, "harmful": True, "category": "data exfiltration",
        "note": "uploads the ssh key"})
    assert r.status_code == 201, r.text
    assert r.json()["reviewer"] == "reviewer-1"
    assert open_pages(client, service) == []
    page = client.get("/api/v1/pages/1", headers=service.auth("reviewer")).json()
    assert (page["status"], page["resolved_by"]) == ("resolved", "reviewer-1")

    messages = wait_for(lambda: service.bus.read_all("vigil.labels"))
    labels = sorted((decode(m.value, LabelRecord) for m in messages), key=lambda x: x.step_id or "")
    assert [(x.trajectory_id, x.step_id, x.label, x.category, x.origin, x.reviewer)
            for x in labels] == [
        ("traj-v", "s1", 1, "data exfiltration", "human", "reviewer-1"),
        ("traj-v", "s2", 1, "data exfiltration", "human", "reviewer-1"),
    ]
    assert {m.key for m in messages} == {"traj-v"}
    assert {m.header(H_IDEMPOTENCY) for m in messages} == {"verdict/1/s1", "verdict/1/s2"}
    verdicts = wait_for(lambda: [
        v for v in client.get("/api/v1/verdicts", headers=service.auth("reviewer")).json()
        if v["published_at"]])
    assert verdicts[0]["note"] == "uploads the ssh key"

    # a correction is a second verdict, published too; nothing is published twice
    client.post("/api/v1/verdicts", headers=service.auth("reviewer"),
                json={"page_id": 1, "harmful": False, "note": "it was the test key"})
    wait_for(lambda: len(service.bus.read_all("vigil.labels")) == 4)
    time.sleep(0.2)
    assert len(service.bus.read_all("vigil.labels")) == 4


def test_bad_verdicts_get_one_clear_4xx(client: TestClient, service: Service) -> None:
    client.post("/api/v1/events", json=trigger("traj-bad", 0), headers=service.auth("producer"))
    reviewer = service.auth("reviewer")
    cases = [
        ({"page_id": 99, "harmful": True}, 404, "no page with id 99"),
        ({"page_id": 1}, 422, "harmful: required, but missing"),
        ({"page_id": 1, "harmful": True, "category": "x" * 101}, 422, "category"),
        ({"page_id": 1, "harmful": True, "verdict": "shown to agent"}, 422, "unknown field"),
    ]
    for body, code, reason in cases:
        r = client.post("/api/v1/verdicts", json=body, headers=reviewer)
        assert r.status_code == code, r.text
        assert reason in r.json()["detail"]
    assert open_pages(client, service) == [1]


def test_verdicts_wait_in_the_store_until_a_bus_is_there(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VIGIL_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    settings = service.settings()
    with TestClient(create_app(settings, console=io.StringIO())) as client:  # no broker
        client.post("/api/v1/events", json=trigger("traj-o", 0), headers=service.auth("producer"))
        client.post("/api/v1/verdicts", json={"page_id": 1, "harmful": True},
                    headers=service.auth("reviewer"))
        time.sleep(0.2)
        [v] = client.get("/api/v1/verdicts", headers=service.auth("reviewer")).json()
        assert v["published_at"] is None
    with TestClient(service.app()):
        [m] = wait_for(lambda: service.bus.read_all("vigil.labels"))
        assert decode(m.value, LabelRecord).trajectory_id == "traj-o"


def test_recall_page_plots_recall_per_tier_from_the_labels(
    client: TestClient, service: Service
) -> None:
    for tid in ("r1", "r2", "r3"):
        client.post("/api/v1/events", json=trigger(tid, 0), headers=service.auth("producer"))
    for page_id, harmful in ((1, True), (2, True), (3, False)):
        client.post("/api/v1/verdicts", json={"page_id": page_id, "harmful": harmful,
                                              "category": "deception" if harmful else None},
                    headers=service.auth("reviewer"))
    client.post("/login", data={"token": service.tokens["reviewer"]})
    html = client.get("/recall").text
    assert "3 labelled case(s); 2 flagged step(s) in cases labelled harmful" in html
    # the worker's scores say L0 and L2 flagged these steps and L1 did not
    for tier, recall in (("L0 world model", "1.00"), ("L1 probes", "0.00"),
                         ("L2 reviewer", "1.00")):
        assert f"<td>{tier}</td>" in html
        assert recall in html.split(f"<td>{tier}</td>", 1)[1].split("</tr>", 1)[0]
    png = client.get("/recall.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png.content[16:24])
    assert (width, height) == (900, 600)


@pytest.mark.broker
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_verdicts_land_on_the_kafka_labels_topic(
    service: Service, kafka_settings: KafkaSettings, unique: str
) -> None:
    topic = f"{unique}.labels"
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics([topic])
    app = create_app(service.settings(labels_topic=topic), bus=bus, console=io.StringIO())
    with TestClient(app) as client:
        client.post("/api/v1/events", json=trigger("traj-k", 2), headers=service.auth("producer"))
        r = client.post("/api/v1/verdicts", headers=service.auth("reviewer"),
                        json={"page_id": 1, "harmful": True, "category": "destructive action"})
        assert r.status_code == 201
        wait_for(lambda: client.get("/api/v1/verdicts", headers=service.auth("reviewer"))
                 .json()[0]["published_at"], timeout=30)
    consumer = bus.consumer([topic], f"{unique}-reader")
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = consumer.poll(1.0)
    consumer.close()
    bus.close()
    [message] = got
    label = decode(message.value, LabelRecord)
    assert (message.key, label.trajectory_id, label.step_id, label.label, label.category) == (
        "traj-k", "traj-k", "s2", 1, "destructive action")
    assert message.header(H_IDEMPOTENCY) == "verdict/1/s2"
