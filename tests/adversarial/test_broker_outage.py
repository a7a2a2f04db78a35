"""A broker outage with a worker running: the worker stays up, says so within seconds
(an ALERT line, ``/healthz`` 503, ``vigil_broker_up 0``), and once the broker is back it
resumes by itself and screens every step, those sent before the outage included.

Two outages: a durable broker (``file://`` storage) killed with SIGKILL and started again
on its port, and a memory broker that comes back empty (no topics, no offsets)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker, free_port
from streams.config import KafkaSettings
from streams.kafka import KafkaBus
from streams.processor import publish_record
from streams.records import StepEvent, Trajectory, decode, step_events
from tests.worker.conftest import Outputs

pytestmark = pytest.mark.broker


def _health(port: int) -> tuple[int, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _events(small_agentdojo: Path, n: int, tag: str) -> list[StepEvent]:
    out: list[StepEvent] = []
    for line in (small_agentdojo / "trajectories.jsonl").read_text().splitlines():
        t = decode(line, Trajectory)
        t = t.model_copy(update={"source": "deployment", "trajectory_id": f"{tag}-{len(out)}"})
        out.extend(step_events(t))
        if len(out) >= n:
            return out[:n]
    return out


def _send(settings: KafkaSettings, topic: str, events: list[StepEvent]) -> None:
    bus = KafkaBus(settings)
    try:
        for e in events:
            publish_record(bus, topic, e, key=e.trajectory_id)
        bus.flush()
    finally:
        bus.close()


@pytest.mark.parametrize("storage", ["file", "memory"])
def test_the_worker_alerts_waits_and_resumes_after_a_broker_outage(
    storage, start_stream, topics, small_agentdojo, unique, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    url = f"file://{tmp_path / 'kafka'}" if storage == "file" else "memory://tansu/"
    broker = EmbeddedBroker(storage=url).start()
    try:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="t")
        setup = KafkaBus(settings)
        setup.ensure_topics(topics.all())
        setup.close()
        port = free_port()
        worker = start_stream(topics, "--role", "screen", "probe", "--group", f"{unique}.w",
                              "--bootstrap-servers", broker.bootstrap_servers,
                              "--metrics-port", str(port))
        before = _events(small_agentdojo, 8, "before")
        _send(settings, topics.steps_deployment, before)
        # the first steps wait for the models to load: minutes on two cores shared with a
        # judge training in the other test worker
        worker.wait_for("screened 8 steps", timeout=360)
        assert _health(port)[0] == 200

        broker.kill()
        killed = time.monotonic()
        while _health(port)[0] != 503:
            assert time.monotonic() - killed < 10, "no alert within 10 s of the broker's death"
            time.sleep(0.5)
        assert "broker down" in " ".join(_health(port)[1]["problems"])
        worker.wait_for("ALERT the broker does not answer", timeout=5)
        time.sleep(8)  # the outage goes on; the worker waits for it
        assert worker.proc.poll() is None, worker.log()[-3000:]

        broker.restart()
        back = time.monotonic()
        expect = 4 if storage == "memory" else 12  # a memory broker lost the first 8
        after = _events(small_agentdojo, 4, "after")
        deadline = time.monotonic() + 30
        while True:  # a producer of the test's own, until the new broker takes the steps
            try:
                _send(settings, topics.steps_deployment, after)
                break
            except Exception:  # noqa: BLE001 - the broker may still be starting its topics
                assert time.monotonic() < deadline, "the restarted broker never took a step"
                time.sleep(1)
        reader = KafkaBus(settings)
        out = Outputs(reader, topics, f"{unique}.reader")
        want = {f"{e.trajectory_id}/{e.step.step_id}" for e in after}
        if storage == "file":
            want |= {f"{e.trajectory_id}/{e.step.step_id}" for e in before}

        def resumed(o: Outputs) -> bool:
            return {k.rsplit("/", 1)[0] for k in o.keys(topics.scores, tier=0)} >= want

        assert out.read_until(resumed, timeout=60), worker.log()[-3000:]
        assert len(want) == expect
        took = time.monotonic() - back
        healthy = time.monotonic() + 30  # the L1 stage's held outputs may still be going out
        while _health(port)[0] != 200:
            assert time.monotonic() < healthy, (_health(port), worker.log()[-3000:])
            time.sleep(0.5)
        assert "is back" in worker.log()
        assert worker.proc.poll() is None
        print(f"{storage}: alert within {10:.0f} s, resumed {took:.1f} s after the restart")
        assert worker.terminate() == 0, worker.log()[-3000:]
        out.close()
        reader.close()
    finally:
        broker.stop()
