"""`monitor rlhealth` against the real Tansu broker, scraped over its real /metrics endpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from monitor.rlhealth.simulate import simulate_rl_run
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import H_DLQ_REASON, publish_record
from streams.records import Score, decode
from tests.streamutil import drain

ROOT = Path(__file__).resolve().parents[2]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


@pytest.mark.broker
def test_rlhealth_command_streams_tito_topics_to_scores_metrics_and_deadletters(
    kafka_settings: KafkaSettings, topics: Topics, unique: str
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    run = simulate_rl_run(steps=12, queries=2, group_size=4, collapse_at=9, seed=5)
    for r in run.records:
        dest = topics.tito_calls if r.kind == "tito.call" else topics.tito_executions
        publish_record(bus, dest, r, key=r.execution_id)
    # bad input: not JSON, and a call whose log-probs do not match its tokens
    bus.publish(topics.tito_calls, b"{not json", key="bad-1")
    bus.publish(
        topics.tito_calls,
        b'{"execution_id":"x","call_id":"c","input_ids":[1],"output_ids":[2,3],'
        b'"output_logprobs":[-0.1]}',
        key="bad-2",
    )
    bus.flush()

    env = {**os.environ, **{f"VIGIL_TOPIC_{k.upper()}": v for k, v in topics.model_dump().items()}}
    cmd = [
        sys.executable, "-m", "monitor.cli", "rlhealth",
        "--bootstrap-servers", kafka_settings.bootstrap_servers or "",
        "--group", f"{unique}.rl", "--metrics-port", "0", "--idle-timeout", "4",
        "--grace", "0.2", "--close-after", "1.0", "--phi", "1", "--mu", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/metrics)", line)
        assert url, f"no metrics URL in {line!r}"
        text = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(url.group(1), timeout=5).read().decode()
            done = _metric(text, 'vigil_rl_executions_total{timed_out="false"}') + _metric(
                text, 'vigil_rl_executions_total{timed_out="true"}'
            )
            if done == run.executions and _metric(text, 'vigil_rl_alerts_total{kind="drift"}') > 0:
                break
            time.sleep(0.5)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err

    # what a Prometheus server scraping the running command saw
    assert done == run.executions
    assert _metric(text, "vigil_rl_staleness_count") == run.executions
    assert _metric(text, "vigil_rl_staleness_expected") == 1.5
    assert _metric(text, 'vigil_rl_alerts_total{kind="drift"}') >= 1
    assert _metric(text, "vigil_rl_drift_abs_nats_count") == run.calls
    assert _metric(text, "vigil_rl_node_occurrences_total") > _metric(
        text, "vigil_rl_unique_nodes_total"
    )
    assert "vigil_rl_execution_duration_seconds_bucket" in text
    assert "vigil_rl_mismatch_abs_logprob" in text and "vigil_rl_out_of_trust_share" in text

    # the report it printed names the early warning before the collapse
    drift_versions = [int(v) for v in re.findall(r"\[drift\].* at version (\d+) grew", out)]
    assert drift_versions and min(drift_versions) < run.collapse_at, out
    assert "dead-lettered 2" in out

    # one L0 score per execution, and a flagged one per alert, on the scores topic
    published = re.search(r"published (\d+)", out)
    assert published, out
    n = int(published.group(1))
    scores = [decode(m.value, Score) for m in drain(bus, topics.scores, f"{unique}.s", n)]
    assert len(scores) == n
    per_exec = [s for s in scores if s.step_id == "rlhealth"]
    assert Counter(s.trajectory_id for s in per_exec) == Counter(
        {r.execution_id: 1 for r in run.records if r.kind == "tito.execution"}
    )
    assert all(
        "rl_staleness" in s.signals and "rl_drift_abs_nats_max" in s.signals for s in per_exec
    )
    # the score is the execution's L0 flag level: 1 when it timed out, else its drift share
    for s in per_exec:
        want = 1.0 if s.signals["rl_timed_out"] else s.signals["rl_out_of_trust_share"]
        assert s.score == want
    assert any(0 < s.score < 1 for s in per_exec)  # the collapse drifts tokens out of trust
    alerts = [s for s in scores if s.step_id == "alert"]
    assert any(s.flagged and "rl_alert_drift" in s.signals for s in alerts)

    dead = drain(bus, topics.deadletter, f"{unique}.d", 2)
    reasons = sorted((m.header(H_DLQ_REASON) or "") for m in dead)
    assert len(dead) == 2 and all(r.startswith("invalid:") for r in reasons), reasons
    assert any("output_logprobs" in r for r in reasons)
    bus.close()
