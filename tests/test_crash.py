"""SIGKILL a worker mid-stream and restart it: after de-duplication every step is out once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from streams.kafka import KafkaBus
from streams.processor import H_IDEMPOTENCY, publish_record
from streams.records import Score, Trajectory, decode, step_events

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).parent / "workers" / "score_worker.py"


def _start(broker: EmbeddedBroker, *topics_and_group: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), broker.bootstrap_servers, *topics_and_group],
        env=env,
        cwd=ROOT,
    )


def test_sigkill_mid_stream_loses_no_step(broker: EmbeddedBroker, kafka_settings, unique) -> None:  # type: ignore[no-untyped-def]
    src, out, dlq, group = (
        f"{unique}.steps",
        f"{unique}.scores",
        f"{unique}.dlq",
        f"{unique}.workers",
    )
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics([src, out, dlq])
    for t in range(20):
        traj = Trajectory.model_validate(
            {
                "trajectory_id": f"traj{t}",
                "steps": [
                    {"step_id": f"s{i}", "index": i, "action": {"text": "x"}} for i in range(15)
                ],
            }
        )
        for e in step_events(traj):
            publish_record(bus, src, e, key=e.trajectory_id)
    bus.flush()
    expected = {f"traj{t}/s{i}/0" for t in range(20) for i in range(15)}

    reader = bus.consumer([out], f"{unique}.reader")
    outputs: list[str] = []

    def read_for(seconds: float, until: int | None = None) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or len(set(outputs)) < until):
            for m in reader.poll(0.3):
                decode(m.value, Score)
                outputs.append(m.header(H_IDEMPOTENCY) or "")

    deadline = time.monotonic() + 30
    while not reader.assigned and time.monotonic() < deadline:  # join before the worker starts
        outputs.extend(m.header(H_IDEMPOTENCY) or "" for m in reader.poll(0.2))
    assert reader.assigned
    worker = _start(broker, src, out, dlq, group)
    read_for(60, until=60)  # let it get well into the stream ...
    worker.send_signal(signal.SIGKILL)  # ... and kill it without warning
    assert worker.wait(10) == -signal.SIGKILL
    read_for(1.0)
    at_kill = len(set(outputs))
    assert 0 < at_kill < len(expected), "the kill must land mid-stream"

    restarted = _start(broker, src, out, dlq, group)
    read_for(90, until=len(expected))
    assert restarted.wait(60) == 0
    read_for(1.0)
    reader.close()
    bus.close()

    counts = Counter(outputs)
    assert set(counts) == expected, f"missing: {sorted(expected - set(counts))[:5]}"
    # at-least-once: redelivery may repeat a step, never invent one; dedup leaves exactly one each
    assert sum(counts.values()) >= len(expected)
