"""Rollout executions that never end, in the reassembly stage: one whose end record never
comes is emitted as it is (its last event marked ``incomplete``) once the timeout passes,
by the wall clock or by the producer times of later records, or once too many are open;
and the stage's commits then reach the end of its input. Both bus backends."""

from __future__ import annotations

from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import publish_record
from streams.records import StepEvent, decode
from streams.rollouts import TreeCollector, reassembly_processor
from streams.synthetic import coding_execution
from tests.streamutil import drain


def test_an_execution_without_its_end_is_emitted_incomplete_and_commits_advance(
    bus: Bus, topics: Topics, unique: str
) -> None:
    bus.ensure_topics(topics.all())
    calls_a, _never = coding_execution("exec-a", seed=1)
    calls_b, end_b = coding_execution("exec-b", seed=2)
    for r in [*calls_a, *calls_b]:
        publish_record(bus, topics.tito_calls, r, key=r.execution_id)
    publish_record(bus, topics.tito_executions, end_b, key="exec-b")
    bus.flush()

    proc, r = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.0, open_timeout_s=1.0)
    proc.run(idle_timeout_s=3.0)
    assert r.collector.timed_out == 1 and proc.hold is not None and proc.hold() == {}
    events = [decode(m.value, StepEvent) for m in
              drain(bus, topics.steps_rollout, f"{unique}.r", len(calls_a) + len(calls_b))]
    a = [e for e in events if e.trajectory_id == "exec-a"]
    assert {e.step.step_id for e in a} == {c.call_id for c in calls_a}
    assert a[-1].final and a[-1].meta["incomplete"] is True
    assert not any(e.meta.get("incomplete") for e in events if e.trajectory_id == "exec-b")

    # everything was committed: a second member of the group has nothing to do
    again, r2 = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.0)
    stats = again.run(idle_timeout_s=2.0)
    assert stats.consumed == 0 and r2.collector.timed_out == 0


def _msg(offset: int, ts_ms: int) -> Message:
    return Message("calls", 0, offset, None, b"", timestamp_ms=ts_ms)


def test_producer_time_and_count_close_an_execution_before_the_wall_clock_does() -> None:
    now = [0.0]
    c = TreeCollector(grace_s=0.0, open_timeout_s=60.0, max_open=2, clock=lambda: now[0])
    calls = {eid: coding_execution(eid, seed=i)[0] for i, eid in enumerate("abcd")}
    c.handle(calls["a"][0], _msg(0, 1_000))
    assert c.ready() == []
    # a backlog read after a restart: a record produced 2 minutes later shows "a" is stale
    c.handle(calls["b"][0], _msg(1, 121_000))
    assert [t.execution_id for t in c.ready()] == ["a"]
    # three open at once, at most two kept: the least recently active goes
    c.handle(calls["c"][0], _msg(2, 121_500))
    c.handle(calls["d"][0], _msg(3, 121_600))
    assert [t.execution_id for t in c.ready()] == ["b"]
    now[0] = 61.0  # and past the wall-clock timeout, the rest
    assert sorted(t.execution_id for t in c.ready()) == ["c", "d"]
    assert c.timed_out == 4 and c.hold() == {}
