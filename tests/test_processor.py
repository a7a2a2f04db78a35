"""The at-least-once processor: bad input is dead-lettered with its reason, the stream goes on."""

from __future__ import annotations

import contextlib
import json

from streams.bus import Bus
from streams.processor import (
    H_DLQ_OFFSET,
    H_DLQ_REASON,
    H_DLQ_TOPIC,
    H_IDEMPOTENCY,
    Output,
    StreamProcessor,
    publish_record,
)
from streams.records import Score, StepEvent, Trajectory, decode, encode, step_events
from tests.streamutil import drain


def _trajectory(tid: str, n: int) -> Trajectory:
    return Trajectory.model_validate(
        {
            "trajectory_id": tid,
            "source": "deployment",
            "task": "book a flight",
            "steps": [
                {
                    "step_id": f"s{i}",
                    "index": i,
                    "action": {"text": f"call {i}"},
                    "observation": {"text": f"obs {i}"},
                }
                for i in range(n)
            ],
        }
    )


def score_step(event: StepEvent, _msg: object) -> list[Output]:
    score = Score(
        trajectory_id=event.trajectory_id,
        step_id=event.step.step_id,
        tier=0,
        score=min(1.0, len(event.step.action.text) / 100),
    )
    return [Output("OUT", score, key=event.trajectory_id, idempotency_key=score.idempotency_key)]


def test_bad_records_go_to_deadletter_and_the_stream_keeps_going(bus: Bus, unique: str) -> None:
    src, out, dlq = f"{unique}.steps", f"{unique}.scores", f"{unique}.dlq"
    bus.ensure_topics([src, out, dlq])
    good = step_events(_trajectory("t1", 3))
    valid = json.loads(encode(good[0]))
    wrong_type = {**valid, "step": {**valid["step"], "index": "first"}}
    missing_key = {k: v for k, v in valid.items() if k != "trajectory_id"}
    oversize = {**valid, "step": {**valid["step"], "action": {"text": "x" * 5000}}}
    bad = {
        b'{"trajectory_id": "t1", "step": {"step_id"': "not valid JSON",
        json.dumps(wrong_type).encode(): "step.index",
        json.dumps(missing_key).encode(): "trajectory_id",
        json.dumps(oversize).encode(): "exceeds the limit of 4096 bytes",
        b"\xff\xfe\x00garbage": "not valid JSON",
    }
    publish_record(bus, src, good[0], key="t1")
    for payload in bad:
        bus.publish(src, payload, key="t1")
    for event in good[1:]:
        publish_record(bus, src, event, key="t1")
    bus.flush()

    def handler(event, msg):  # type: ignore[no-untyped-def]
        return [Output(out, o.record, o.key, o.idempotency_key) for o in score_step(event, msg)]

    proc = StreamProcessor(
        bus,
        {src: StepEvent},
        f"{unique}.worker",
        handler,
        deadletter_topic=dlq,
        max_record_bytes=4096,
    )
    stats = proc.run(idle_timeout_s=3.0, max_messages=len(good) + len(bad))

    assert stats.consumed == 8 and stats.processed == 3 and stats.dead_lettered == 5
    scores = [decode(m.value, Score) for m in drain(bus, out, f"{unique}.r1", 3)]
    assert [s.step_id for s in scores] == ["s0", "s1", "s2"], "good records after bad ones flow"
    letters = drain(bus, dlq, f"{unique}.r2", 5)
    assert {m.value for m in letters} == set(bad), "dead letters carry the original bytes"
    for m in letters:
        reason = m.header(H_DLQ_REASON) or ""
        assert bad[m.value] in reason, reason
        assert m.header(H_DLQ_TOPIC) == src and m.header(H_DLQ_OFFSET) is not None
        assert m.key == "t1"


def test_inputs_are_committed_only_with_their_outputs(bus: Bus, unique: str) -> None:
    """A handler that crashes the process mid-batch leaves the batch uncommitted."""
    src, out, dlq = f"{unique}.steps", f"{unique}.scores", f"{unique}.dlq"
    bus.ensure_topics([src, out, dlq])
    for e in step_events(_trajectory("t1", 4)):
        publish_record(bus, src, e, key="t1")
    bus.flush()

    class Crash(BaseException):
        pass

    calls = []

    def dies_on_third(event, msg):  # type: ignore[no-untyped-def]
        calls.append(event.step.step_id)
        if len(calls) == 3:
            raise Crash  # BaseException: not a bad record, a dying process
        return [Output(out, o.record, o.key, o.idempotency_key) for o in score_step(event, msg)]

    proc = StreamProcessor(
        bus, {src: StepEvent}, f"{unique}.w", dies_on_third, deadletter_topic=dlq, batch_size=100
    )
    with contextlib.suppress(Crash):
        proc.run(idle_timeout_s=3.0)

    def ok(event, msg):  # type: ignore[no-untyped-def]
        return [Output(out, o.record, o.key, o.idempotency_key) for o in score_step(event, msg)]

    StreamProcessor(bus, {src: StepEvent}, f"{unique}.w", ok, deadletter_topic=dlq).run(
        idle_timeout_s=3.0, max_messages=4
    )
    msgs = drain(bus, out, f"{unique}.r", 6, timeout_s=10)
    keys = [m.header(H_IDEMPOTENCY) for m in msgs]
    assert set(keys) == {f"t1/s{i}/0" for i in range(4)}, "every step scored after restart"
