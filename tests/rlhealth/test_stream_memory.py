"""The RL-health processor on the in-process bus: redeliveries, shuffles, holds and commits."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry

from monitor.rlhealth.alerts import AlertConfig
from monitor.rlhealth.metrics import RLHealthMetrics
from monitor.rlhealth.simulate import simulate_rl_run
from monitor.rlhealth.stream import RLHealthConfig, RLHealthMonitor, rlhealth_processor
from streams.bus import InMemoryBus
from streams.config import Topics
from streams.processor import publish_record
from streams.records import Score, decode


def test_shuffled_redelivered_records_give_one_score_per_execution() -> None:
    bus = InMemoryBus(partitions=3)
    topics = Topics()
    bus.ensure_topics(topics.all())
    run = simulate_rl_run(steps=8, queries=2, group_size=4, collapse_at=7, seed=1)
    records = list(run.records)
    random.Random(0).shuffle(records)
    for r in records + records[:20]:  # at least once: some delivered twice
        dest = topics.tito_calls if r.kind == "tito.call" else topics.tito_executions
        publish_record(bus, dest, r, key=r.execution_id)
    config = RLHealthConfig(alerts=AlertConfig(phi=1, mu=2), close_lag=None, close_after_s=60.0)
    monitor = RLHealthMonitor(config, RLHealthMetrics(CollectorRegistry()))
    proc, stream = rlhealth_processor(bus, topics, monitor, "g", grace_s=0.0)
    stats = proc.run(max_messages=len(records) + 20)
    stats = proc.run(idle_timeout_s=0.3)  # the ticks that emit what has ended
    assert proc.stats.dead_lettered == 0
    assert monitor.executions == run.executions and stream.hold() == {}
    scores = [decode(m.value, Score) for m in bus.read_all(topics.scores)]
    per_exec = {s.trajectory_id for s in scores if s.step_id == "rlhealth"}
    assert len(per_exec) == run.executions == len([s for s in scores if s.step_id == "rlhealth"])
    assert monitor.late_samples == 0 and stats.consumed == len(records) + 20


def test_open_executions_hold_back_the_commit() -> None:
    bus = InMemoryBus(partitions=1)
    topics = Topics()
    bus.ensure_topics(topics.all())
    run = simulate_rl_run(steps=2, queries=1, group_size=2, seed=2)
    calls = [r for r in run.records if r.kind == "tito.call"]
    for r in calls:  # calls only: no execution has ended
        publish_record(bus, topics.tito_calls, r, key=r.execution_id)
    monitor = RLHealthMonitor()
    proc, stream = rlhealth_processor(bus, topics, monitor, "g", grace_s=0.0)
    proc.run(max_messages=len(calls))
    assert monitor.executions == 0
    assert stream.hold() == {(topics.tito_calls, 0): 0}  # nothing may be committed yet
