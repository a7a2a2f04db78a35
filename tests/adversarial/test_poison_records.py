"""Poison pills on the real broker: a record nested 5,000 deep, NaN, a 6,000-digit number,
an oversized record, a second step under a step id already taken, and a rollout execution that
never ends. Each is dead-lettered (or
closed as incomplete) once, every valid step around them is scored, the worker exits
cleanly, and its commits reach the end so a restart redoes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streams.kafka import KafkaBus
from streams.processor import H_DLQ_REASON, H_DLQ_SIZE, publish_record
from streams.records import Action, StepEvent, Trajectory, decode, step_events
from tests.worker.conftest import ROOT, Outputs, committed

pytestmark = pytest.mark.broker


def _steps(small_agentdojo, n: int) -> list[StepEvent]:  # type: ignore[no-untyped-def]
    lines = (small_agentdojo / "trajectories.jsonl").read_text().splitlines()
    out: list[StepEvent] = []
    for line in lines:
        t = decode(line, Trajectory).model_copy(update={"source": "deployment"})
        out.extend(step_events(t))
        if len(out) >= n:
            break
    return out[:n]


POISON = {
    "deep": b"[" * 5000 + b"]" * 5000,
    "nan": b'{"trajectory_id": "p", "step": {"step_id": "s", "index": 0, "action": '
           b'{"text": "x"}}, "meta": {"score": NaN}}',
    "digits": b'{"trajectory_id": "p", "step": {"step_id": "s", "index": ' + b"9" * 6000 + b"}}",
    "oversize": b'{"trajectory_id": "p", "task": "' + b"x" * 1_100_000 + b'"}',
}


def test_poison_records_are_dead_lettered_once_and_the_stream_goes_on(
    start_stream, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    bus = KafkaBus(kafka_settings.model_copy(update={"max_record_bytes": 4_000_000}))
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    steps = _steps(small_agentdojo, 12)
    for i, ev in enumerate(steps):  # poison between valid steps, on every partition
        publish_record(bus, topics.steps_deployment, ev, key=ev.trajectory_id)
        if i % 3 == 0 and POISON:
            name, payload = POISON.popitem()
            bus.publish(topics.steps_deployment, payload, key=f"poison-{name}")
    # another step under a step id already screened: its score would share the first one's
    # idempotency key, so a consumer de-duplicating by key would drop it unseen
    other = steps[0].model_copy(update={"step": steps[0].step.model_copy(
        update={"action": Action(text="rm -rf ~")})})
    publish_record(bus, topics.steps_deployment, other, key=other.trajectory_id)
    bus.flush()
    total = 12 + 4 + 1
    group = f"{unique}.w"
    first = start_stream(topics, "--role", "screen", "--group", group, "--idle-timeout", "4")
    assert first.proc.wait(240) == 0, first.log()[-3000:]
    assert out.read_until(lambda o: len(o.of(topics.deadletter)) >= 5
                          and len(set(o.keys(topics.scores, tier=0))) >= 12, timeout=30)
    reasons = sorted(m.header(H_DLQ_REASON) or "" for m in out.of(topics.deadletter))
    assert any("nested 5000 levels deep" in r for r in reasons), reasons
    assert any(r.startswith("duplicate:") and repr(steps[0].step.step_id) in r
               for r in reasons), reasons
    assert any("NaN" in r for r in reasons) and any("digits" in r for r in reasons)
    oversize = [m for m in out.of(topics.deadletter) if m.key == "poison-oversize"]
    assert oversize and int(oversize[0].header(H_DLQ_SIZE) or 0) > 1_100_000
    assert {k.rsplit("/", 1)[0] for k in out.keys(topics.scores, tier=0)} == {
        f"{e.trajectory_id}/{e.step.step_id}" for e in steps}
    assert committed(kafka_settings, f"{group}-screen", topics.steps_deployment) == total

    # a restart finds nothing to redo: no dead letter and no score a second time
    again = start_stream(topics, "--role", "screen", "--group", group, "--idle-timeout", "3")
    assert again.proc.wait(240) == 0, again.log()[-3000:]
    out.read_until(lambda o: False, timeout=3)
    assert len(out.of(topics.deadletter)) == 5
    assert len(out.keys(topics.scores, tier=0)) == 12
    out.close()
    bus.close()


def test_an_execution_that_never_ends_does_not_hold_commits(
    start_stream, topics, kafka_settings, small_agentdojo, unique  # type: ignore[no-untyped-def]
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    out = Outputs(bus, topics, f"{unique}.reader")
    step = _steps(small_agentdojo, 1)[0].step
    abandoned = StepEvent(trajectory_id="abandoned", source="rollout", step=step,
                          meta={"execution_id": "abandoned"})
    publish_record(bus, topics.steps_rollout, abandoned, key="abandoned")
    for i in range(100):
        ev = StepEvent(trajectory_id=f"done-{i}", source="rollout", step=step, final=True,
                       meta={"execution_id": f"done-{i}"})
        publish_record(bus, topics.steps_rollout, ev, key=ev.trajectory_id)
    bus.flush()
    group = f"{unique}.w"
    first = start_stream(topics, "--role", "screen", "probe", "--group", group,
                         "--idle-timeout", "6", "--execution-timeout", "2")
    assert first.proc.wait(240) == 0, first.log()[-3000:]
    assert out.read_until(lambda o: len(o.of(topics.verdicts_rollout)) >= 101, timeout=30)
    verdicts = {json.loads(m.value)["execution_id"]: json.loads(m.value)
                for m in out.of(topics.verdicts_rollout)}
    assert verdicts["abandoned"]["incomplete"] is True
    assert not any(v["incomplete"] for k, v in verdicts.items() if k != "abandoned")
    assert "incomplete" in first.log()
    assert committed(kafka_settings, f"{group}-screen", topics.steps_rollout) == 101
    assert committed(kafka_settings, f"{group}-probe", topics.steps_l0) == 101

    again = start_stream(topics, "--role", "screen", "probe", "--group", group,
                         "--idle-timeout", "3")
    assert again.proc.wait(240) == 0, again.log()[-3000:]
    out.read_until(lambda o: False, timeout=3)
    assert len(out.keys(topics.scores, tier=0)) == 101, "a clean restart re-screens nothing"
    out.close()
    bus.close()


def test_monitor_screen_refuses_a_deep_line_and_an_empty_file_in_one_sentence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b"[" * 5000 + b"]" * 5000 + b"\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    for path, says in ((deep, "nested 5000 levels deep"), (empty, "no trajectories")):
        r = subprocess.run([sys.executable, "-m", "monitor.cli", "screen", str(path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "VIGIL_HOME": str(tmp_path / "home")})
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "home" / "models").exists(), "no model is built or loaded"


