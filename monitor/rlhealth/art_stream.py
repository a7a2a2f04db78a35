"""The ART part of the RL-health stream: rollouts and trainer iterations → alerts and steps.

    art.rollouts / art.iterations → ArtMonitor (signals, alerts) → alert scores
                                   → one rollout step per endpoint, for the tiers

Records of a version still open live only in memory, so their offsets are held: commits
never pass the first record of an open version, and a crash replays it. Every endpoint is
published once as a rollout step (idempotent by run, prompt, version and endpoint), so the
tiers screen each generated image against the prompt's earlier ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor.rlhealth.alerts import Alert, alert_outputs
from monitor.rlhealth.art import ArtMonitor
from monitor.rlhealth.art_steps import media_step_events
from streams.bus import Message
from streams.config import Topics
from streams.media import ArtIteration, MediaRollout
from streams.processor import Output, Positions


@dataclass
class ArtStream:
    """Handler, tick, flush and hold for the ART topics (part of ``RLHealthStream``)."""

    topics: Topics
    monitor: ArtMonitor
    publish_scores: bool = True
    publish_steps: bool = True
    _first: dict[int, dict[tuple[str, int], int]] = field(default_factory=dict)

    def handle(self, record: MediaRollout | ArtIteration, message: Message) -> list[Output]:
        alerts = self.monitor.observe(record)
        version = record.policy_version
        if version in self.monitor.open_versions:  # in memory only until it closes
            firsts = self._first.setdefault(version, {})
            tp = (message.topic, message.partition)
            firsts[tp] = min(firsts.get(tp, message.offset), message.offset)
        out = self._release(alerts)
        if isinstance(record, MediaRollout) and self.publish_steps:
            out += [
                Output(
                    self.topics.steps_rollout,
                    event,
                    key=event.trajectory_id,
                    idempotency_key=f"{event.trajectory_id}/{event.step.step_id}",
                )
                for event in media_step_events(record)
            ]
        return out

    def tick(self) -> list[Output]:
        return self._release(self.monitor.tick())

    def flush(self) -> list[Output]:
        return self._release(self.monitor.finish())

    def hold(self) -> Positions:
        held: dict[tuple[str, int], int] = {}
        for firsts in self._first.values():
            for tp, off in firsts.items():
                held[tp] = min(held.get(tp, off), off)
        return held

    def _release(self, alerts: list[Alert]) -> list[Output]:
        """Forget the offsets of closed versions; the alerts as scores."""
        still_open = set(self.monitor.open_versions)
        for v in [v for v in self._first if v not in still_open]:
            del self._first[v]
        return alert_outputs(self.topics.scores, alerts) if self.publish_scores else []
