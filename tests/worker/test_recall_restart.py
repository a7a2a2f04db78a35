"""A restarted recall stage still knows how far the steps screened before the restart went:
a human verdict that arrives after it counts against the tiers its step reached. On the
real broker."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from dashboards.ground_truth import reached_counts
from dashboards.metrics import WorkerMetrics
from monitor.stream.build import build_worker
from monitor.stream.runner import Worker, WorkerConfig
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import publish_record
from streams.records import LabelRecord, Score

# step -> the scores its tiers published; it reached: s0 L0, s1 L2, s2 L1, s3 L3, s4 L0
SCORES = {
    "s0": [(0, False)],
    "s1": [(0, True), (1, True)],
    "s2": [(0, True), (1, False)],
    "s3": [(0, True), (1, True), (2, True)],
    "s4": [(0, False)],
}


def _run_recall(settings: KafkaSettings, topics: Topics, group: str) -> tuple[Worker, list[str]]:
    said: list[str] = []
    metrics = WorkerMetrics(CollectorRegistry())
    worker = build_worker(WorkerConfig(topics=topics, roles=("recall",), group=group,
                                       idle_timeout_s=3.0),
                          lambda: KafkaBus(settings), report=said.append, metrics=metrics)
    assert worker.run() == 0, said
    return worker, said


def _label(step: str) -> LabelRecord:
    return LabelRecord(trajectory_id="traj", step_id=step, label=1, category="exfiltration",
                       origin="human", reviewer="ana")


def test_a_verdict_after_a_restart_counts_against_the_tiers_reached_before_it(
    kafka_settings: KafkaSettings, topics: Topics, unique: str
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    for step, tiers in SCORES.items():
        for tier, flagged in tiers:
            publish_record(bus, topics.scores, Score(trajectory_id="traj", step_id=step,
                                                     tier=tier, score=0.5, flagged=flagged),
                           key="traj")
    publish_record(bus, topics.labels, _label("s4"), key="traj")  # before the restart
    bus.flush()

    first, _ = _run_recall(kafka_settings, topics, unique)
    assert first.metrics is not None
    assert reached_counts(first.metrics) == {"human": [1, 0, 0, 0]}

    for step in ("s0", "s1", "s2", "s3"):  # the reviewer's verdicts come in while it is down
        publish_record(bus, topics.labels, _label(step), key="traj")
    bus.flush()
    bus.close()

    second, said = _run_recall(kafka_settings, topics, unique)
    assert second.metrics is not None and second.recall is not None
    assert second.recall.warmed_up == 9  # every score, read back from before the commit
    # s0..s3 counted once each at every tier they reached; s4 was counted by the first
    # process and is not counted again
    assert reached_counts(second.metrics) == {"human": [4, 3, 2, 1]}
    assert any("read back 9 scores" in line for line in said)


def test_a_read_back_that_fails_halfway_keeps_what_it_read_and_the_stage_runs() -> None:
    """A broker that stops answering during the read-back costs recall counts of older
    steps, not the stage."""
    from dashboards.ground_truth import LabelJoin
    from monitor.stream.recall import RecallStage
    from streams.bus import InMemoryBus, Message

    class StallingBus(InMemoryBus):
        def read_before_committed(self, topic: str, group_id: str, per_partition: int
                                  ) -> Iterator[Message]:
            it = super().read_before_committed(topic, group_id, per_partition)
            yield next(it)
            raise TimeoutError("reading back took over 300 s")

    topics = Topics()
    bus = StallingBus(partitions=1)
    for tier in (0, 1):
        publish_record(bus, topics.scores, Score(trajectory_id="traj", step_id="s1", tier=tier,
                                                 score=0.9, flagged=True), key="traj")
    bus._committed["g"][(topics.scores, 0)] = 2  # a previous process committed both
    said: list[str] = []
    metrics = WorkerMetrics(CollectorRegistry())
    stage = RecallStage(topics, LabelJoin(metrics), report=said.append)
    proc = stage.processor(bus, "g")
    assert stage.warmed_up == 1 and any("then stopped (TimeoutError" in s for s in said)
    publish_record(bus, topics.labels, _label("s1"), key="traj")
    proc.run(idle_timeout_s=0.5)
    assert reached_counts(metrics) == {"human": [1, 1, 0, 0]}  # the tier-0 score it read
