"""TITO topics → rollout step events through a real stream (both bus backends)."""

from __future__ import annotations

import random
from collections import Counter

from streams.bus import Bus
from streams.config import Topics
from streams.processor import H_DLQ_REASON, H_IDEMPOTENCY, publish_record
from streams.records import StepEvent, decode
from streams.rollouts import reassembly_processor
from streams.synthetic import coding_execution
from tests.streamutil import drain


def _publish(bus: Bus, topics: Topics, records: list) -> None:  # type: ignore[type-arg]
    for r in records:
        dest = topics.tito_calls if r.kind == "tito.call" else topics.tito_executions
        publish_record(bus, dest, r, key=r.execution_id)
    bus.flush()


def test_each_policy_output_is_published_once_with_its_tree(
    bus: Bus, topics: Topics, unique: str
) -> None:
    bus.ensure_topics(topics.all())
    calls_a, end_a = coding_execution("exec-a", seed=1)
    calls_b, end_b = coding_execution("exec-b", harmful=True, seed=2)
    records = [*calls_a, *calls_b, end_a, end_b]
    random.Random(3).shuffle(records)
    _publish(bus, topics, records + records[:5])  # with redelivered duplicates

    proc, r = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.2)
    stats = proc.run(idle_timeout_s=2.0)
    assert stats.dead_lettered == 0 and r.admissions["duplicate"] == 5

    n = len(calls_a) + len(calls_b)
    events = [
        decode(m.value, StepEvent) for m in drain(bus, topics.steps_rollout, f"{unique}.r", n)
    ]
    assert Counter((e.trajectory_id, e.step.step_id) for e in events) == Counter(
        {(c.execution_id, c.call_id): 1 for c in calls_a + calls_b}
    )
    for eid in ("exec-a", "exec-b"):
        mine = [e for e in events if e.trajectory_id == eid]
        order = [e.step.step_id for e in mine]
        for e in mine:  # parents are published before their children
            parent = e.meta["parent_step_id"]
            assert parent is None or order.index(parent) < order.index(e.step.step_id)
        assert [e.final for e in mine].count(True) == 1 and mine[-1].final
        assert mine[-1].meta["reward"] == 1.0
        shared = next(e for e in mine if e.step.step_id == "m1")
        assert len(shared.meta["leaf_trajectory_ids"]) == 2  # one output, two leaves
        assert mine[0].source == "rollout" and "USER: Add a --verbose flag" in mine[0].task


def test_a_crash_before_an_execution_ends_replays_its_calls(
    bus: Bus, topics: Topics, unique: str
) -> None:
    bus.ensure_topics(topics.all())
    calls_a, end_a = coding_execution("exec-a", seed=1)
    calls_b, end_b = coding_execution("exec-b", seed=2)
    _publish(bus, topics, [*calls_a, *calls_b, end_b])  # exec-a still running

    first, _ = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.0)
    first.run(idle_timeout_s=2.0)  # emits exec-b, buffers exec-a in memory ...
    del first  # ... and the process dies: its memory is gone

    _publish(bus, topics, [end_a])
    second, r = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.0)
    second.run(idle_timeout_s=2.0)

    events = [
        decode(m.value, StepEvent)
        for m in drain(bus, topics.steps_rollout, f"{unique}.r", len(calls_a) + len(calls_b))
    ]
    got_a = {e.step.step_id for e in events if e.trajectory_id == "exec-a"}
    assert got_a == {c.call_id for c in calls_a}, "exec-a's uncommitted calls were replayed"


def test_a_call_after_its_execution_was_emitted_is_dead_lettered(
    bus: Bus, topics: Topics, unique: str
) -> None:
    bus.ensure_topics(topics.all())
    calls, end = coding_execution("exec-a", seed=1)
    late = calls[-1].model_copy(update={"call_id": "m99"})
    _publish(bus, topics, [*calls, end])
    proc, _ = reassembly_processor(bus, topics, f"{unique}.g", grace_s=0.0)
    proc.run(idle_timeout_s=1.5)
    _publish(bus, topics, [late])
    proc.run(idle_timeout_s=1.5)
    (letter,) = drain(bus, topics.deadletter, f"{unique}.r", 1)
    assert "exec-a was already emitted" in (letter.header(H_DLQ_REASON) or "")
    out = drain(bus, topics.steps_rollout, f"{unique}.r2", len(calls))
    assert len({m.header(H_IDEMPOTENCY) for m in out}) == len(calls)
