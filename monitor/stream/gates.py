"""A stage's live gate sketches (``monitor stream --adapt``): saved to the gates topic with
the stage's outputs, read back when the stage starts again.

Each stage that decides a gate (L0: gate 0; L1: gates 1 and 2) keeps its own sketches, keyed
by its consumer group. The stage reads the gates topic as one of its inputs, so its commits
cover the sketches it saved; a restart resumes from the newest one committed
(``Bus.read_before_committed``), and, before the first step is screened, from any newer one
it reads back (published with a batch's outputs but not yet committed).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from monitor.stream.stats import Report
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, Reject, StreamProcessor
from streams.records import GateState, Record, RecordError, decode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from monitor.adaptive import LiveGates


class GateSketches:
    """Saving and resuming one stage's :class:`~monitor.adaptive.LiveGates`."""

    def __init__(self, live: LiveGates, topics: Topics, report: Report, *,
                 every_s: float = 10.0) -> None:
        self.live = live
        self.topics = topics
        self.report = report
        self.every_s = every_s
        self.group = ""
        self.screened = False  # whether this process has screened a step yet
        self._saved = 0.0
        self._restored_at = 0.0  # created_at of the sketches resumed from

    def restore(self, bus: Bus, group_id: str) -> None:
        """Resume from the newest sketches this group saved and committed."""
        self.group = group_id
        latest: GateState | None = None
        try:
            for m in bus.read_before_committed(self.topics.gates, group_id, 1):
                try:
                    rec = decode(m.value, GateState)
                except RecordError:
                    continue
                if rec.group == group_id and (latest is None or rec.created_at > latest.created_at):
                    latest = rec
            if latest is not None:
                self.live.restore(latest.state.encode())
                self._restored_at = latest.created_at
        except Exception as e:  # noqa: BLE001 - start from the calibrated thresholds instead
            self.report(f"vigil stream: live gates start afresh ({type(e).__name__}: {e})")
            return
        if latest is not None:
            seen = [g.scores.n for g in self.live.gates]
            self.report(f"vigil stream: {group_id}: live gates resumed from the sketches saved "
                        f"at {time.strftime('%H:%M:%S', time.localtime(latest.created_at))} "
                        f"({', '.join(f'L{k}: {n} scores' for k, n in enumerate(seen))})")

    def read_back(self, rec: GateState) -> None:
        """Before this process screens its first step, the newest sketches its group saved
        after the last commit win; afterwards the stage's own sketches are newer."""
        if self.screened or rec.group != self.group:
            return
        if rec.created_at > self._restored_at:
            self.live.restore(rec.state.encode())
            self._restored_at = rec.created_at

    def save(self, now: float) -> list[Output]:
        """The sketches, every ``every_s``, onto the gates topic."""
        if now - self._saved < self.every_s:
            return []
        self._saved = now
        rec = GateState(group=self.group, state=self.live.to_bytes().decode(), created_at=now)
        return [Output(self.topics.gates, rec, key=self.group,
                       idempotency_key=f"{self.group}/gates/{now:.3f}")]


def stage_processor(
    bus: Bus,
    group_id: str,
    inputs: dict[str, type[Record]],
    *,
    topics: Topics,
    sketches: GateSketches | None,
    handler: Callable[[list[tuple[Record, Message]]], Iterable[Output | Reject]],
    hold: Callable[[], Positions],
    tick: Callable[[], list[Output]],
    batch_size: int,
) -> StreamProcessor:
    """A screening stage's processor over ``inputs``; with live gates, the gates topic is one
    of them (so the group's commits cover its saved sketches) and the sketches are resumed."""
    if sketches is not None:
        inputs = {**inputs, topics.gates: GateState}
        sketches.restore(bus, group_id)
    return StreamProcessor(bus, inputs, group_id, batch_handler=handler,
                           deadletter_topic=topics.deadletter, batch_size=batch_size,
                           hold=hold, tick=tick, ensure_topics=topics.all())
