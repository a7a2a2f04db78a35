"""The recall stage: labels joined with scores into ``vigil_labelled_steps_total``.

    consume  vigil.labels (dataset, canary and human labels) and vigil.scores
    join     how far each labelled step went (``dashboards.ground_truth.LabelJoin``)
    publish  nothing: Prometheus counters, from which recall per tier is computed
"""

from __future__ import annotations

import time

from dashboards.ground_truth import LabelJoin
from monitor.stream.stats import Report
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, StreamProcessor
from streams.records import LabelRecord, Record, RecordError, Score, decode


class RecallStage:
    """Joins the labels topic (dataset, canary and human labels) with the scores topic
    (how far each step went) into ``vigil_labelled_steps_total`` (``dashboards.ground_truth``).

    It publishes nothing. Its state (how far each of the last ``max_steps`` steps went)
    outlives a restart: before joining its group, the stage reads the scores topic back
    from its group's committed offsets (``Bus.read_before_committed``), so a human verdict
    that arrives after the restart still counts against the tiers its step reached. Labels
    are not read back: those before the commit were counted by the previous process.
    """

    def __init__(self, topics: Topics, join: LabelJoin,
                 report: Report | None = None) -> None:
        self.topics = topics
        self.join = join
        self.report = report
        self.warmed_up = 0

    def warm_up(self, bus: Bus, group_id: str) -> int:
        """Rebuild the join's state from the scores before ``group_id``'s commit; returns
        how many scores were read (unreadable ones are skipped: they were dead-lettered
        when first consumed)."""
        t0 = time.monotonic()
        per_partition = max(1, self.join.max_steps)
        n = 0
        try:
            for m in bus.read_before_committed(self.topics.scores, group_id, per_partition):
                try:
                    rec = decode(m.value, Score)
                except RecordError:
                    continue
                self.join.on_score(rec)
                n += 1
        except Exception as e:  # noqa: BLE001 - recall counts are worth less than the stage
            said = (f"read back {n} scores, then stopped ({type(e).__name__}: {e}); verdicts "
                    "on older steps count only the tiers seen from now on")
        else:
            said = (f"read back {n} scores of steps screened before the restart "
                    f"({time.monotonic() - t0:.1f} s)") if n else ""
        self.warmed_up += n
        if said and self.report is not None:
            self.report(f"vigil stream: recall stage {said}")
        return n

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 500) -> StreamProcessor:
        self.warm_up(bus, group_id)
        return StreamProcessor(
            bus,
            {self.topics.scores: Score, self.topics.labels: LabelRecord},
            group_id,
            handler=self.handle,
            deadletter_topic=self.topics.deadletter,
            batch_size=batch_size,
            ensure_topics=self.topics.all(),
        )

    def handle(self, rec: Record, _m: Message) -> list[Output]:
        if isinstance(rec, Score):
            self.join.on_score(rec)
        elif isinstance(rec, LabelRecord):
            self.join.on_label(rec)
        return []
