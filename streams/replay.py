"""Replay a JSON Lines file onto the bus, as the live producers would have sent it.

A file may hold interchange trajectories (published as one step event per
step, keyed by trajectory id, to a steps topic), TITO records (calls to the
calls topic, execution ends to the executions topic, keyed by execution id) or
generated-media rollouts (ART: rollouts and trainer iterations to their topics,
keyed by run id).
The whole file is validated before anything is published, so a bad line is
one clear error and never a half-replayed file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streams.bus import Bus
from streams.config import Topics
from streams.media import ArtIteration, MediaRollout, sniff_media
from streams.processor import publish_record
from streams.records import (
    ExecutionEnd,
    Record,
    RecordError,
    StepEvent,
    TitoCall,
    Trajectory,
    parse_json,
    sniff_kind,
    step_events,
    validate,
)


@dataclass
class ReplayReport:
    lines: int = 0
    published: Counter[str] = field(default_factory=Counter)  # topic -> records

    @property
    def total(self) -> int:
        return sum(self.published.values())


def read_records(path: str | Path) -> Iterator[Record]:
    """Each non-blank line as the record its keys say it is; errors name file and line."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    with p.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            obj = parse_json(raw, "JSON Lines", line=n)
            if not isinstance(obj, dict):
                raise RecordError("JSON Lines", "expected a JSON object", line=n)
            yield validate(obj, sniff_media(obj) or sniff_kind(obj), line=n)


def replay_file(
    path: str | Path,
    bus: Bus,
    topics: Topics,
    *,
    topic: str | None = None,
    source: str | None = None,
    on_record: Callable[[], None] | None = None,
) -> ReplayReport:
    """Publish every record of ``path``; ``topic`` overrides where steps / calls go.

    Trajectories go to the steps topic of their ``source`` (rollout or
    deployment) unless ``topic`` is given; ``source`` overrides the file's.
    """
    records = list(read_records(path))  # validate all before publishing any
    report = ReplayReport(lines=len(records))
    for rec in records:
        if isinstance(rec, Trajectory):
            if source is not None:
                rec = rec.model_copy(update={"source": source})
            dest = topic or (
                topics.steps_rollout if rec.source == "rollout" else topics.steps_deployment
            )
            for event in step_events(rec):
                _send(bus, dest, event, event.trajectory_id, report, on_record)
        elif isinstance(rec, TitoCall):
            _send(bus, topic or topics.tito_calls, rec, rec.execution_id, report, on_record)
        elif isinstance(rec, ExecutionEnd):
            _send(bus, topics.tito_executions, rec, rec.execution_id, report, on_record)
        elif isinstance(rec, MediaRollout):
            _send(bus, topic or topics.art_rollouts, rec, rec.run_id, report, on_record)
        elif isinstance(rec, ArtIteration):
            _send(bus, topics.art_iterations, rec, rec.run_id, report, on_record)
        elif isinstance(rec, StepEvent):
            _send(bus, topic or topics.steps_deployment, rec, rec.trajectory_id, report, on_record)
    bus.flush()
    return report


def _send(
    bus: Bus,
    topic: str,
    record: Record,
    key: str,
    report: ReplayReport,
    on_record: Callable[[], None] | None,
) -> None:
    publish_record(bus, topic, record, key=key)
    report.published[topic] += 1
    if on_record:
        on_record()
