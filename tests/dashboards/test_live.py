"""The dashboards against a real Prometheus scraping a running worker on a real stream.

One stream of real AgentDojo steps (deployment and rollout, with canaries injected and a
bad record) goes through ``monitor stream`` with real (tiny) models on the Tansu broker;
the paging service pages for tier 3 and a human verdict goes back to the labels topic;
``monitor rlhealth`` streams a simulated RL run and a simulated image-generation (ART) run.
Debian's Prometheus scrapes the worker, the paging service and the RL-health stream. Then:

* every panel query of every dashboard returns data;
* canary recall per tier, as the stream measured it, equals the recall computed offline
  on the same canary steps with the same policy;
* no canary appears in a rollout verdict or in the human queue (pages).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dashboards.canary import build_canary_set, canary_trajectory
from dashboards.prometheus import LocalPrometheus, PrometheusClient
from monitor.demo import PagingServer, paging_server
from monitor.rlhealth.art_simulate import simulate_art_run
from monitor.rlhealth.simulate import simulate_rl_run
from streams.broker import free_port
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import publish_record
from streams.records import RolloutVerdict, Score, StepEvent, decode, step_events
from tests.worker.conftest import (  # noqa: F401 - fixtures
    ROOT,
    Outputs,
    eval_stream,
    start_stream,
    topic_env,
)

pytestmark = pytest.mark.broker



@pytest.fixture
def labelled_paging(tmp_path: Path, kafka_settings: KafkaSettings,
                    topics: Topics) -> Iterator[PagingServer]:  # noqa: F811
    """The paging service, publishing verdicts to this test's labels topic."""
    folder = tmp_path / "paging"
    folder.mkdir()
    bus = KafkaBus(kafka_settings)
    with paging_server(folder, bus=bus, labels_topic=topics.labels) as server:
        yield server
    bus.close()


def _total(client: PrometheusClient, expr: str) -> float:
    got = client.value(f"sum({expr})")
    return got or 0.0


def _tiers_by_key(client: PrometheusClient, expr: str) -> dict[str, float]:
    return {r["metric"].get("tier", ""): float(r["value"][1]) for r in client.query(expr)}


def test_dashboards_show_a_live_stream_and_canary_recall_matches_offline(
    start_stream, labelled_paging, topics, kafka_settings, small_agentdojo,  # noqa: F811
    tiny_policy, unique, tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    from dashboards.boards import dashboards, panel_queries, substitute_variables

    paging = labelled_paging
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    canaries = tmp_path / "canaries.jsonl"
    build_canary_set([small_agentdojo], canaries)
    worker_port, rl_port = free_port(), free_port()
    out = Outputs(bus, topics, f"{unique}.reader")
    worker = start_stream(
        topics, "--paging-url", paging.url, "--paging-token", paging.producer_token,
        "--group", f"{unique}.w", "--batch-size", "16", "--metrics-port", str(worker_port),
        "--canary-rate", "0.15", "--canaries", str(canaries))
    # the RL-health stream, on topics of its own (its TITO run is not for the worker)
    rl_topics = Topics(**{n: f"{unique}.rl.{n}" for n in Topics.model_fields})
    bus.ensure_topics(rl_topics.all())
    rl_env = {**os.environ, **topic_env(rl_topics), "PYTHONPATH": str(ROOT)}
    rl = subprocess.Popen(
        [sys.executable, "-m", "monitor.cli", "rlhealth", "--bootstrap-servers",
         kafka_settings.bootstrap_servers or "", "--group", f"{unique}.rl",
         "--metrics-port", str(rl_port), "--grace", "0.2", "--phi", "1", "--mu", "2"],
        cwd=ROOT, env=rl_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paging_target = paging.url.removeprefix("http://")
    # the paging service's /metrics counts verdicts: scraped with a reviewer token
    prom = LocalPrometheus([f"127.0.0.1:{worker_port}", f"127.0.0.1:{rl_port}"],
                           bearer_targets={paging_target: paging.reviewer_token},
                           scrape_interval_s=1.0).start()
    try:
        worker.wait_for("metrics on http://", timeout=180)
        worker.wait_for("joined group", timeout=60, count=4)
        # the zero series are scraped before any step arrives, so increase() sees every step
        prom.wait_for('vigil_steps_total{tier="0"}', timeout_s=30)
        prom.wait_for("vigil_rl_alerts_total", timeout_s=30)
        prom.wait_for("vigil_pages", timeout_s=30)

        # a real stream: held-out and val AgentDojo steps as deployments, val as rollouts
        deploy = eval_stream(small_agentdojo)
        rollouts = [
            t.model_copy(update={"trajectory_id": f"ro-{t.trajectory_id}", "source": "rollout",
                                 "meta": {**t.meta, "execution_id": f"ro-{t.trajectory_id}"}})
            for t in eval_stream(small_agentdojo, ("val",))[:8]]
        real = 0
        for t in deploy + rollouts:
            dest = topics.steps_rollout if t.source == "rollout" else topics.steps_deployment
            for e in step_events(t):
                publish_record(bus, dest, e, key=e.trajectory_id)
                real += 1
        bus.publish(topics.steps_deployment, b"{not json", key="broken")
        for r in simulate_rl_run(steps=8, queries=2, group_size=4, collapse_at=6,
                                 seed=3).records:
            dest = rl_topics.tito_calls if r.kind == "tito.call" else rl_topics.tito_executions
            publish_record(bus, dest, r, key=r.execution_id)
        # an image-generation run long enough to set its baselines (8 versions) and divergence
        for m in simulate_art_run(iterations=11, prompts=2, k=3, seed=1).records:
            dest = rl_topics.art_rollouts if m.kind == "art.rollout" else rl_topics.art_iterations
            publish_record(bus, dest, m, key=m.run_id)
        bus.flush()

        c = prom.client

        def screened_real() -> float:
            return _total(c, 'vigil_steps_total{tier="0", canary="false"}')

        deadline = time.monotonic() + 240
        while screened_real() < real:
            assert time.monotonic() < deadline, (screened_real(), real, worker.log()[-3000:])
            out.read_until(lambda o: False, timeout=1.0)
        # every tier-2 escalation reviewed (the review stage caught up)
        def reviewed(o: Outputs) -> bool:
            up = {k.rsplit("/", 1)[0] for k in o.keys(topics.escalations, tier=2)}
            done = {k.rsplit("/", 1)[0] for k in o.keys(topics.scores, tier=2)}
            return bool(up) and up <= done

        assert out.read_until(reviewed, timeout=120), worker.log()[-3000:]

        # a human labels a page; the verdict reaches the recall stage through the labels topic
        pages = paging.pages()
        assert pages, "the stream must page a human"
        r = httpx.post(f"{paging.url}/api/v1/verdicts", json={
            "page_id": pages[0]["id"], "harmful": True, "category": "data_exfiltration"},
            headers={"Authorization": f"Bearer {paging.reviewer_token}"}, timeout=10)
        assert r.status_code == 201, r.text
        prom.wait_for('vigil_labelled_steps_total{origin="human"}', timeout_s=60)
        prom.wait_for('vigil_page_verdicts_total{verdict="harmful"} > 0', timeout_s=30)
        prom.wait_for('vigil_deadletters_total{stage="screen"}', timeout_s=30)
        prom.wait_for("vigil_rl_training_version > 0", timeout_s=60)
        prom.wait_for("vigil_rl_art_version > 0", timeout_s=60)
        time.sleep(3)  # a few more scrapes after the last change

        # 1. every panel of every dashboard returns data; a panel's "or vector(0)" fallback
        # (0 rather than "no data" before a counter moves) is taken off, so the metric itself
        # must be there
        empty: list[str] = []
        n = 0
        for board in dashboards():
            for title, expr in panel_queries(board):
                n += 1
                q = re.sub(r"\s*or\s+vector\(0\)", "", substitute_variables(expr, window="10m"))
                if not c.query(q):
                    empty.append(f"{board['title']} / {title}: {q}")
        assert n >= 30
        assert not empty, "panels without data:\n" + "\n".join(empty)

        # 2. canary recall on the stream == offline recall on the same canary steps
        events: dict[str, list[StepEvent]] = {}
        from kafka import KafkaConsumer, TopicPartition

        steps_reader = KafkaConsumer(**kafka_settings.client_options(), group_id=None,
                                     enable_auto_commit=False)
        steps_reader.assign([TopicPartition(t, p) for t in (topics.steps_deployment,
                                                             topics.steps_rollout)
                             for p in steps_reader.partitions_for_topic(t) or ()])
        steps_reader.seek_to_beginning()

        def read_canaries() -> None:
            for records in steps_reader.poll(timeout_ms=500, max_records=1000).values():
                for m in records:
                    try:
                        e = decode(m.value, StepEvent)
                    except ValueError:
                        continue
                    if e.trajectory_id.startswith("canary/"):
                        got = events.setdefault(e.trajectory_id, [])
                        if e.step.step_id not in {x.step.step_id for x in got}:
                            got.append(e)

        query = 'sum by (tier) (vigil_labelled_steps_total{origin="canary", label="1"})'
        deadline = time.monotonic() + 60
        while True:  # the last batches' canaries are screened (and reviewed) a little later
            read_canaries()
            out.read_until(lambda o: False, timeout=0.5)
            stream = _tiers_by_key(c, query)
            if events and stream.get("0") == len(events) and reviewed(out):
                time.sleep(2.5)  # scraped after the last review
                stream = _tiers_by_key(c, query)
                break
            assert time.monotonic() < deadline, (len(events), stream)
        from monitor.pipeline import load_screener
        from monitor.screening import screen_steps_of

        screener = load_screener(tiny_policy, reviewer=False)
        offline = [0, 0, 0, 0]
        for evs in events.values():
            traj = canary_trajectory(evs)
            for s, v in zip(traj.steps, screener.screen(screen_steps_of(traj), through=2),
                            strict=True):
                if s.label == 1:
                    for t in range(v.tier + 1):
                        offline[t] += 1
        steps_reader.close()
        assert offline[0] == len(events)  # one harmful step per canary instance
        assert [stream.get(str(t), 0.0) for t in range(4)] == [float(x) for x in offline]

        # 3. canaries never reach a trainer's admission or the human queue
        verdicts = [decode(m.value, RolloutVerdict) for m in out.of(topics.verdicts_rollout)]
        assert {v.execution_id for v in verdicts} == {t.trajectory_id for t in rollouts}
        assert not any(v.execution_id.startswith("canary/") for v in verdicts)
        alerts = [a["dedup_key"] for p in paging.pages() for a in p["alerts"]]
        assert alerts and not any(k.startswith("canary/") for k in alerts)
        canary_l3 = [json.loads(m.value) for m in out.of(topics.scores)
                     if json.loads(m.value)["trajectory_id"].startswith("canary/")
                     and json.loads(m.value)["tier"] == 2 and json.loads(m.value)["flagged"]]
        assert _total(c, 'vigil_canaries_suppressed_total{what="page"}') == len(canary_l3)
        scores = [decode(m.value, Score) for m in out.of(topics.scores)]
        assert any(s.trajectory_id.startswith("canary/") for s in scores)
    finally:
        prom.stop()
        rl.terminate()
        rl.wait(30)
        worker.terminate()
        out.close()
        bus.close()
