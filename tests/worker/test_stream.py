"""`monitor stream` on the real broker, the real paging service and real (tiny) models.

A stream of benign and hijacked AgentDojo steps goes through worker processes; what a
user notices is checked: every step scored once at L0, harmful steps further up the
tiers, one page per tier-3 step even across a SIGKILL and a restart, bad records in
the dead-letter topic, two processes splitting the work, and a clean SIGTERM.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from monitor.demo import PagingServer, step_tiers
from monitor.pipeline import load_review_screener
from monitor.stream.paging import PagingClient
from monitor.stream.review import ReviewStage
from streams.broker import free_port
from streams.bus import InMemoryBus, Message
from streams.config import Topics
from streams.kafka import KafkaBus
from streams.processor import H_DLQ_REASON, Output, StreamProcessor, publish_record
from streams.records import Escalation, Record, Score, StepEvent, Trajectory, encode
from tests.worker.conftest import ROOT, Outputs, committed, eval_stream, publish

pytestmark = pytest.mark.broker


def _tier3(out: Outputs, topics: Topics) -> set[str]:
    tiers = step_tiers(out.of(topics.scores), out.of(topics.escalations))
    return {k for k, t in tiers.items() if t == 3}


def _flagged_at_l0(out: Outputs, topics: Topics) -> set[str]:
    """``trajectory/step`` of every step L0 passed up to L1."""
    return {f"{r['trajectory_id']}/{r['step_id']}" for m in out.of(topics.scores)
            if (r := json.loads(m.value))["tier"] == 0 and r["flagged"]}


def _probe_lag(port: int) -> float | None:
    """The probe stage's ``vigil_consumer_lag`` summed over its partitions (``None`` before
    the stage reports any)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    got = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
           if line.startswith("vigil_consumer_lag{") and 'stage="probe"' in line]
    return sum(got) if got else None


def _reviewed_all(out: Outputs, topics: Topics) -> bool:
    """Every step L0 passed up has its L1 score (the probe stage caught up), and every
    tier-2 escalation its L2 score (the review stage caught up)."""
    probed = {k.rsplit("/", 1)[0] for k in out.keys(topics.scores, tier=1)}
    up = {k.rsplit("/", 1)[0] for k in out.keys(topics.escalations, tier=2)}
    done = {k.rsplit("/", 1)[0] for k in out.keys(topics.scores, tier=2)}
    return _flagged_at_l0(out, topics) <= probed and up <= done


def _check_pages(paging: PagingServer, tier3: set[str]) -> list[dict]:  # type: ignore[type-arg]
    """One alert per tier-3 step and one page per trajectory (alerts of one trajectory
    join its open page): nothing paged twice."""
    pages = paging.pages()
    alerts = [a["dedup_key"] for p in pages for a in p["alerts"]]
    assert sorted(alerts) == sorted(tier3), "every tier-3 step pages, and only those"
    by_traj = Counter(p["trajectory_id"] for p in pages)
    assert by_traj == Counter({k.rsplit("/", 1)[0] for k in tier3}), "no second page"
    return pages


def test_a_stream_reaches_the_tiers_pages_once_and_stops_cleanly(
    start_stream, paging, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    worker = start_stream(topics, "--paging-url", paging.url, "--paging-token",
                          paging.producer_token, "--group", f"{unique}.w", "--batch-size", "16")
    trajs = eval_stream(small_agentdojo)
    labels = publish(bus, topics, trajs)
    bus.publish(topics.steps_deployment, b"{not json", key="broken-1")
    bad = StepEvent.model_validate({"trajectory_id": "broken-2",
                                    "step": {"step_id": "s0", "index": 0, "action": {}}})
    raw = json.loads(encode(bad))
    del raw["step"]
    bus.publish(topics.steps_deployment, json.dumps(raw).encode(), key="broken-2")
    bus.flush()
    expected = {f"{k}/0" for k in labels}

    def done(o: Outputs) -> bool:
        return set(o.keys(topics.scores, tier=0)) >= expected and _reviewed_all(o, topics)

    assert out.read_until(done, timeout=150), worker.log()[-3000:]
    out.read_until(lambda o: len(o.of(topics.deadletter)) >= 2, timeout=10)
    assert worker.terminate() == 0, worker.log()[-3000:]  # SIGTERM: finish, commit, leave
    out.read_until(lambda o: False, timeout=1.0)
    out.close()

    # every step exactly one tier-0 score; L1 scored exactly what L0 passed up
    tier0 = Counter(out.keys(topics.scores, tier=0))
    assert set(tier0) == expected and set(tier0.values()) == {1}
    passed = {json.loads(m.value)["step_id"] + "@" + json.loads(m.value)["trajectory_id"]
              for m in out.of(topics.scores) if json.loads(m.value)["tier"] == 0
              and json.loads(m.value)["flagged"]}
    l1 = {json.loads(m.value)["step_id"] + "@" + json.loads(m.value)["trajectory_id"]
          for m in out.of(topics.scores) if json.loads(m.value)["tier"] == 1}
    assert l1 == passed
    for m in out.of(topics.escalations):
        e = Escalation.model_validate_json(m.value)
        assert e.trajectory is not None and e.trajectory.steps[-1].step_id == e.step_id
        assert m.key == e.trajectory_id
    # harmful steps climb higher
    tiers = step_tiers(out.of(topics.scores), out.of(topics.escalations))
    harmful = [tiers[k] for k, y in labels.items() if y == 1]
    benign = [tiers[k] for k, y in labels.items() if y == 0]
    assert statistics.mean(harmful) > statistics.mean(benign)
    tier3 = _tier3(out, topics)
    assert tier3, "the stream must reach a human"
    pages = _check_pages(paging, tier3)
    alert = next(a for p in pages for a in p["alerts"])
    details = alert["details"]
    assert details["step_id"] == alert["dedup_key"].rsplit("/", 1)[1]
    assert [s["tier"] for s in details["scores"]] == [0, 1, 2]
    assert details["trajectory"]["steps"][-1]["step_id"] == details["step_id"]
    # bad records dead-lettered with the reason, unchanged
    dl = out.of(topics.deadletter)
    assert b"{not json" in {m.value for m in dl}
    assert all((m.header(H_DLQ_REASON) or "").startswith("invalid:") for m in dl)
    assert len(dl) == 2
    # after SIGTERM every input is committed: nothing left to redeliver
    assert committed(kafka_settings, f"{unique}.w-screen", topics.steps_deployment) == (
        len(labels) + 2)
    assert "SIGTERM" in worker.log()
    bus.close()


def test_tier0_scores_do_not_wait_for_the_l1_stage(
    start_stream, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    """L0 and L1 are separate stages: with no L1 stage running every step still gets its
    tier-0 score; an L1 stage started later scores what L0 passed up, each after its
    tier-0 score."""
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    labels = publish(bus, topics, eval_stream(small_agentdojo))
    expected = {f"{k}/0" for k in labels}
    screen = start_stream(topics, "--role", "screen", "--group", f"{unique}.w", name="l0")
    assert out.read_until(lambda o: set(o.keys(topics.scores, tier=0)) >= expected, 150), (
        screen.log()[-3000:])
    out.read_until(lambda o: False, timeout=2.0)
    assert not out.keys(topics.scores, tier=1), "no L1 stage runs: no tier-1 score"
    flagged = _flagged_at_l0(out, topics)
    assert flagged, "some steps must be passed up to L1"

    # L1 starts behind the whole stream and takes it two steps a batch: its backlog shows
    # as consumer lag on /metrics (what the lag alert reads) and drains to zero
    port = free_port()
    probe = start_stream(topics, "--role", "probe", "--group", f"{unique}.w", "--batch-size",
                         "2", "--metrics-port", str(port), name="l1")
    lags: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            lag = _probe_lag(port)
            if lag is not None:
                lags.append(lag)
            sampling.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def probed(o: Outputs) -> set[str]:
        return {k.rsplit("/", 1)[0] for k in o.keys(topics.scores, tier=1)}

    assert out.read_until(lambda o: probed(o) >= flagged, 150), probe.log()[-3000:]
    assert probed(out) == flagged, "L1 scores exactly what L0 passed up"
    deadline = time.monotonic() + 20
    while not (lags and lags[-1] == 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    sampling.set()
    sampler.join(5)
    assert lags and max(lags) >= min(10, len(labels) // 2), f"no backlog was visible: {lags}"
    assert lags[-1] == 0, f"the lag did not drain: {lags[-10:]}"
    at = {(r["trajectory_id"], r["step_id"], r["tier"]): r["created_at"]
          for m in out.of(topics.scores) if (r := json.loads(m.value))}
    for k in flagged:
        tid, sid = k.rsplit("/", 1)
        assert at[(tid, sid, 0)] < at[(tid, sid, 1)]
    assert screen.terminate() == 0 and probe.terminate() == 0
    assert committed(kafka_settings, f"{unique}.w-probe", topics.steps_l0) == len(labels)
    out.close()
    bus.close()


def test_sigkill_and_restart_mid_stream_pages_no_step_twice(
    start_stream, paging, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    args = ("--paging-url", paging.url, "--paging-token", paging.producer_token,
            "--group", f"{unique}.w", "--batch-size", "4")
    labels = publish(bus, topics, eval_stream(small_agentdojo))
    expected = {f"{k}/0" for k in labels}
    first = start_stream(topics, *args)
    got_some = out.read_until(lambda o: len(set(o.keys(topics.scores, tier=0))) >= 30, 120)
    assert got_some, first.log()[-3000:]
    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(10) == -signal.SIGKILL
    out.read_until(lambda o: False, timeout=1.0)
    at_kill = set(out.keys(topics.scores, tier=0))
    assert len(at_kill) < len(expected), "the kill must land mid-stream"

    second = start_stream(topics, *args)

    def done(o: Outputs) -> bool:
        return set(o.keys(topics.scores, tier=0)) >= expected and _reviewed_all(o, topics)

    assert out.read_until(done, timeout=150), second.log()[-3000:]
    assert second.terminate() == 0
    out.read_until(lambda o: False, timeout=1.0)
    out.close()
    tier0 = Counter(out.keys(topics.scores, tier=0))
    assert set(tier0) == expected  # every step screened
    # at-least-once: a redelivered batch repeats its scores (same idempotency keys) ...
    assert sum(tier0.values()) >= len(expected)
    # ... and never pages twice
    tier3 = _tier3(out, topics)
    assert tier3
    _check_pages(paging, tier3)
    bus.close()


def test_two_processes_split_the_partitions(
    start_stream, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    args = ("--role", "screen", "--group", f"{unique}.w", "--batch-size", "8")
    a = start_stream(topics, *args, name="a")
    b = start_stream(topics, *args, name="b")
    joined = "screen stage joined group"
    a.wait_for(joined, timeout=120)
    b.wait_for(joined, timeout=120)
    time.sleep(1.0)
    labels = publish(bus, topics, eval_stream(small_agentdojo))
    expected = {f"{k}/0" for k in labels}
    assert out.read_until(lambda o: set(o.keys(topics.scores, tier=0)) >= expected, 150), (
        a.log()[-2000:] + b.log()[-2000:])
    assert a.terminate() == 0 and b.terminate() == 0
    out.read_until(lambda o: False, timeout=1.0)
    out.close()
    tier0 = Counter(out.keys(topics.scores, tier=0))
    assert set(tier0) == expected and set(tier0.values()) == {1}, "every step screened once"
    assert a.screened() > 0 and b.screened() > 0, "each member screened its share"
    assert a.screened() + b.screened() == len(expected)
    bus.close()


def test_review_waits_for_an_unreachable_paging_service_and_then_pages_once(
    tiny_policy: Path, small_agentdojo: Path, paging: PagingServer
) -> None:
    """The paging service is down: nothing is committed or dead-lettered; once it is up,
    the redelivered escalations page once each."""
    topics = Topics()
    bus = InMemoryBus(partitions=2)
    screener = load_review_screener(tiny_policy)
    signals = {s: 0.999 for t in screener.policy.config.tiers for s in t.signals}
    trajs = eval_stream(small_agentdojo, ("val",))[:2]
    for t in trajs:
        e = Escalation(trajectory_id=t.trajectory_id, step_id=t.steps[0].step_id, tier=2,
                       score=0.9, signals=signals, trajectory=Trajectory.model_validate(
                           {**t.model_dump(), "steps": [t.steps[0].model_dump()]}))
        publish_record(bus, topics.escalations, e, key=e.trajectory_id,
                       idempotency_key=e.idempotency_key)
    down = PagingClient("http://127.0.0.1:9", paging.producer_token, timeout_s=1, retries=1,
                        backoff_s=0.05)
    stage = ReviewStage(screener, topics, paging=down, report=lambda _: None)
    proc = stage.processor(bus, "review")
    stop = threading.Event()
    runner = threading.Thread(target=proc.run, kwargs={"stop": stop, "retry_backoff_s": 0.3})
    runner.start()
    deadline = time.monotonic() + 20
    while proc.stats.retries < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.stats.retries >= 2 and proc.stats.dead_lettered == 0
    assert not bus._committed["review"], "nothing committed while the pages are not taken"
    assert paging.pages() == []
    stage.paging = PagingClient(paging.url, paging.producer_token)  # the service is back
    while len(bus.read_all(topics.scores)) < 2 and time.monotonic() < deadline + 20:
        time.sleep(0.05)
    time.sleep(0.5)
    stop.set()
    runner.join(20)
    pages = paging.pages()
    keys = sorted(a["dedup_key"] for p in pages for a in p["alerts"])
    assert keys == sorted(f"{t.trajectory_id}/{t.steps[0].step_id}" for t in trajs)
    # committed through everything on the topic: the two inputs and the two tier-3 outputs
    ends = bus.end_offsets(topics.escalations)
    assert sum(ends) == 4
    assert {tp[1]: n for tp, n in bus._committed["review"].items()} == {
        p: n for p, n in enumerate(ends) if n}


def test_a_batch_that_fails_is_retried_record_by_record() -> None:
    """Only the record that makes the batch handler raise is dead-lettered."""
    bus = InMemoryBus(partitions=1)
    calls: list[int] = []

    def handle(items: list[tuple[Record, Message]]) -> list[Output]:
        calls.append(len(items))
        out = []
        for rec, _ in items:
            assert isinstance(rec, StepEvent)
            if rec.step.step_id == "poison":
                raise RuntimeError("the model choked")
            s = Score(trajectory_id=rec.trajectory_id, step_id=rec.step.step_id, tier=0,
                      score=0.1)
            out.append(Output("scores", s, key=s.trajectory_id, idempotency_key=s.idempotency_key))
        return out

    for sid in ("a", "poison", "b"):
        e = StepEvent.model_validate({"trajectory_id": "t", "step": {
            "step_id": sid, "index": 0, "action": {"text": "x"}}})
        publish_record(bus, "steps", e, key="t")
    proc = StreamProcessor(bus, {"steps": StepEvent}, "g", batch_handler=handle,
                           deadletter_topic="dlq")
    stats = proc.run(max_messages=3)
    assert calls == [3, 1, 1, 1]
    assert [json.loads(m.value)["step_id"] for m in bus.read_all("scores")] == ["a", "b"]
    dl = bus.read_all("dlq")
    assert len(dl) == 1 and "the model choked" in (dl[0].header(H_DLQ_REASON) or "")
    assert stats.processed == 2 and stats.dead_lettered == 1


def test_stream_help_explains_itself() -> None:
    r = subprocess.run([sys.executable, "-m", "monitor.cli", "stream", "--help"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0
    for word in ("examples:", "--role", "--paging-url", "VIGIL_PAGING_TOKEN", "SIGTERM",
                 "vigil.escalations"):
        assert word in r.stdout
    r = subprocess.run([sys.executable, "-m", "monitor.cli", "stream", "--paging-url",
                        "http://x", "--bootstrap-servers", "127.0.0.1:1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "needs a producer token" in r.stderr
