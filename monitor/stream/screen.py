"""The screen stage (L0): step events in; tier-0 scores at once, and every step on to L1.

    consume  vigil.steps.rollout + vigil.steps.deployment (one micro-batch)
    score    Screener.screen(batch, through=0): L0 on every step, gate 0 decided
    publish  Score(tier=0) for every step, the step with its L0 verdict (L0Step) onto
             vigil.steps.l0 for the probe stage (L1), the step's label (replayed benchmark
             data, canaries) and canary trajectories drawn for the batch's real steps

The tier-0 score never waits for L1: the probe stage (:mod:`monitor.stream.probe`) is a
consumer group of its own on ``vigil.steps.l0`` and batches on its own clock. Every step
goes on, escalated or not, so the probe stage can rebuild each trajectory's history and
close rollout executions; its models run only on the escalated ones.

A batch that makes the models fail is retried one record at a time by the processor, so
only the poisoned record is dead-lettered; the stage's state changes only once the whole
batch is scored.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dashboards.canary import canary_events, canary_of, is_canary
from monitor.screening import ScreenStep, screen_step_of
from monitor.stream.gates import GateSketches, stage_processor
from monitor.stream.history import TrajectoryHistory
from monitor.stream.stats import Report, WorkerStats, clip01, finite, stderr
from monitor.stream.verdicts import RolloutVerdicts
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, Reject, StreamProcessor
from streams.records import (
    GateState,
    L0Step,
    LabelRecord,
    Record,
    Score,
    Source,
    Step,
    StepEvent,
)

if TYPE_CHECKING:
    from dashboards.canary import CanaryInjector
    from dashboards.metrics import WorkerMetrics
    from monitor.pipeline import Screener, StepVerdict


@dataclass(frozen=True)
class ScreenedStep:
    """One screened step, for reports (the demo prints these as they happen)."""

    event: StepEvent
    verdict: StepVerdict


class StepHistories:
    """Each step's history, from the steps seen before it (:class:`TrajectoryHistory`), and,
    for rollout executions, the commit hold that lets a crash rebuild it exactly."""

    def __init__(self, history_trajectories: int) -> None:
        self.history = TrajectoryHistory(history_trajectories)

    def steps(self, events: list[StepEvent]) -> tuple[list[ScreenStep], dict[str, OrderedDict[
            str, tuple[Step, str | None]]]]:
        """Each event as a :class:`ScreenStep` with its history, and the batch's steps by
        trajectory (for :meth:`commit`, once the batch is scored)."""
        pending: dict[str, OrderedDict[str, tuple[Step, str | None]]] = {}
        steps: list[ScreenStep] = []
        for e in events:
            steps.append(screen_step_of(e, self.history.before(e, pending)))
            parent = e.meta.get("parent_step_id") if e.meta else None
            pending.setdefault(e.trajectory_id, OrderedDict())[e.step.step_id] = (
                e.step, parent if isinstance(parent, str) else None
            )
        return steps, pending

    def commit(self, events: list[StepEvent],
               pending: Mapping[str, OrderedDict[str, tuple[Step, str | None]]]) -> None:
        for tid, got in pending.items():
            self.history.add(tid, got.values())
        for e in events:
            if e.final and _ends_trajectory(e):  # its history is not needed any more
                self.history.forget(e.trajectory_id)


def _ends_trajectory(e: StepEvent) -> bool:
    """Whether a final step ends its trajectory: it does unless its producer says the
    trajectory goes on (``meta.trajectory_continues``: an ART group ends, the prompt's
    trajectory runs on across policy versions, ``monitor.rlhealth.art_steps``)."""
    return not (e.meta and e.meta.get("trajectory_continues") is True)


def _digest(e: StepEvent) -> bytes:
    """What identifies a step's content: its record without the stream's own bookkeeping."""
    return hashlib.blake2b(e.step.model_dump_json().encode(), digest_size=16).digest()


class ScreenStage:
    """L0 on every step; its tier-0 score at once, the step and its L0 verdict to L1.

    With ``canaries``, every batch of real steps brings canary trajectories onto the same
    steps topic (``dashboards.canary``); they are screened like any step when they come
    back. Every labelled step (replayed benchmark data, canaries) has its label published
    to the labels topic for the recall stage.

    Rollout executions hold commits until their final step (as in the probe stage), so
    after a crash the whole open execution is scored again with its exact history.

    Use :meth:`processor` for the ``StreamProcessor`` over both steps topics.
    """

    def __init__(
        self,
        screener: Screener,
        topics: Topics,
        *,
        stats: WorkerStats | None = None,
        metrics: WorkerMetrics | None = None,
        canaries: CanaryInjector | None = None,
        history_trajectories: int = 10_000,
        max_open_executions: int = 10_000,
        execution_timeout_s: float = 600.0,
        report: Report = stderr,
        gates_every_s: float = 10.0,
        steps_remembered: int = 200_000,
    ) -> None:
        self.screener = screener
        self.steps_remembered = steps_remembered
        self.topics = topics
        self.stats = stats or WorkerStats()
        self.metrics = metrics
        self.canaries = canaries
        self.histories = StepHistories(history_trajectories)
        # the same open executions as the probe stage's, for their commit hold only
        self.open = RolloutVerdicts(topics, self.stats, report, execution_timeout_s=
                                    execution_timeout_s, max_open_executions=max_open_executions,
                                    publish=False)
        self.report = report
        self.sketches = (None if screener.live is None else
                         GateSketches(screener.live, topics, report, every_s=gates_every_s))
        self._canaries_seen: OrderedDict[str, None] = OrderedDict()  # redelivered re-injections
        # each recent step's key (trajectory/step id) and a digest of the step it names: a
        # redelivery is the same step again; another step under a taken key is refused
        self._steps_seen: OrderedDict[str, bytes] = OrderedDict()
        if metrics is not None:
            for k, g in enumerate(screener.policy.gates):
                metrics.gate_budget.labels(gate=f"L{k}").set(g.budget)
                metrics.gate_threshold.labels(gate=f"L{k}", kind="calibrated").set(g.threshold)
            if (t := screener.policy.trajectory) is not None and t.threshold <= 1:
                metrics.gate_threshold.labels(gate="trajectory", kind="calibrated").set(
                    t.threshold)

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 64) -> StreamProcessor:
        inputs: dict[str, type[Record]] = {self.topics.steps_rollout: StepEvent,
                                           self.topics.steps_deployment: StepEvent}
        return stage_processor(bus, group_id, inputs, topics=self.topics,
                               sketches=self.sketches, handler=self.handle_batch,
                               hold=self.hold, tick=self.tick, batch_size=batch_size)

    def tick(self) -> list[Output]:
        self.open.close_quiet(time.time())  # quiet executions stop holding commits
        return []

    def hold(self) -> Positions:
        """The first offset of every open rollout execution: commits never pass it."""
        return self.open.hold()

    def handle_batch(self, items: list[tuple[Record, Message]]) -> list[Output | Reject]:
        # consume: the batch's step events, each with its history
        events, rejected = self._fresh(items)
        if not events:
            return list(rejected)
        if self.sketches is not None:
            self.sketches.screened = True
        steps, pending = self.histories.steps([e for e, _ in events])
        # score and decide: one call of the L0 models for the whole batch
        spent = self.screener.timings.get("L0", 0.0)
        verdicts = self.screener.screen(steps, through=0)  # may raise: nothing changed yet
        now = time.time()
        canary = [is_canary(e.meta) for e, _ in events]
        # publish: the tier-0 score, the step for L1 and the label of every step
        outputs: list[Output | Reject] = list(rejected)
        for (e, m), v, c in zip(events, verdicts, canary, strict=True):
            outputs.extend(self._outputs(e, m, v, now))
            outputs.extend(self._label(e, c, now))
        # state changes only once the whole batch is scored
        self.histories.commit([e for e, _ in events], pending)
        for (e, m), v, c in zip(events, verdicts, canary, strict=True):
            if c:
                self._canaries_seen[f"{e.trajectory_id}/{e.step.step_id}"] = None
            else:
                self.open.track(e, m, v, now)
            self._steps_seen[f"{e.trajectory_id}/{e.step.step_id}"] = _digest(e)
        while len(self._canaries_seen) > 100_000:
            self._canaries_seen.popitem(last=False)
        while len(self._steps_seen) > self.steps_remembered:
            self._steps_seen.popitem(last=False)
        outputs.extend(self._inject(events, canary))
        if self.sketches is not None:
            outputs.extend(self.sketches.save(now))
        self.stats.add("scored_l0", len(events))
        if self.metrics is not None:
            self._observe(events, verdicts, canary, self.screener.timings.get("L0", 0.0) - spent)
        return outputs

    def _fresh(self, items: list[tuple[Record, Message]]
               ) -> tuple[list[tuple[StepEvent, Message]], list[Reject]]:
        """The batch's step events, less canary steps already screened (a redelivered batch
        upstream re-injects the same canary instances), and those refused: a step whose
        trajectory and step id name a different step seen before (in this batch or one of
        the last :attr:`steps_remembered`). Its scores and page would share the first one's
        idempotency keys, so a consumer that de-duplicates by key would drop them unseen."""
        events: list[tuple[StepEvent, Message]] = []
        rejected: list[Reject] = []
        batch: dict[str, bytes] = {}
        for rec, m in items:
            if isinstance(rec, GateState):  # saved sketches read back
                if self.sketches is not None:
                    self.sketches.read_back(rec)
                continue
            if not isinstance(rec, StepEvent):  # pragma: no cover - the models map admits these
                raise TypeError(f"expected a step event, got {rec.kind}")
            key = f"{rec.trajectory_id}/{rec.step.step_id}"
            if is_canary(rec.meta) and key in self._canaries_seen:
                continue
            digest = _digest(rec)
            first = batch.get(key, self._steps_seen.get(key))
            if first is not None and first != digest:
                rejected.append(Reject(m, f"duplicate: step {rec.step.step_id!r} of trajectory "
                                          f"{rec.trajectory_id!r} was already screened with "
                                          "different content; give each step its own step_id"))
                continue
            batch[key] = digest
            events.append((rec, m))
        return events, rejected

    def _outputs(self, e: StepEvent, m: Message, v: StepVerdict, now: float) -> list[Output]:
        tid, sid = e.trajectory_id, e.step.step_id
        signals = finite(v.signals)
        score = clip01(v.gate_scores[0])
        tier0 = Score(trajectory_id=tid, step_id=sid, source=e.source, created_at=now, tier=0,
                      score=score, flagged=v.tier >= 1, signals=signals)
        on = L0Step(event=e, score=score, escalate=v.tier >= 1, signals=signals,
                    produced_ms=max(0, m.timestamp_ms), created_at=now)
        return [Output(self.topics.scores, tier0, key=tid, idempotency_key=tier0.idempotency_key),
                Output(self.topics.steps_l0, on, key=tid, idempotency_key=on.idempotency_key)]

    def _label(self, e: StepEvent, canary: bool, now: float) -> list[Output]:
        """The step's own label (replayed benchmark data, canaries) for the recall stage."""
        if e.step.label is None:
            return []
        tag = canary_of(e.meta) or {}
        category = e.step.category or (tag.get("category") if e.step.label == 1 else None)
        origin: Literal["canary", "dataset"] = "canary" if canary else "dataset"
        rec = LabelRecord(trajectory_id=e.trajectory_id, step_id=e.step.step_id,
                          label=e.step.label, category=category, origin=origin,
                          created_at=now)
        return [Output(self.topics.labels, rec, key=e.trajectory_id,
                       idempotency_key=f"{e.trajectory_id}/{e.step.step_id}/label/{origin}")]

    def _inject(self, events: list[tuple[StepEvent, Message]], canary: list[bool]) -> list[Output]:
        """Canary trajectories for this batch's real steps, onto the topic they came from."""
        if self.canaries is None or self.canaries.rate <= 0:
            return []
        first: dict[str, Message] = {}
        real: dict[str, int] = {}
        for (_e, m), c in zip(events, canary, strict=True):
            if c:
                continue
            first.setdefault(m.topic, m)
            real[m.topic] = real.get(m.topic, 0) + 1
        out: list[Output] = []
        for topic, n in real.items():
            m = first[topic]
            stream: Source = "rollout" if topic == self.topics.steps_rollout else "deployment"
            for got, instance in self.canaries.draw(n, f"{topic}/{m.partition}/{m.offset}"):
                evs = canary_events(got, instance, stream)
                for ev in evs:
                    out.append(Output(topic, ev, key=ev.trajectory_id,
                                      idempotency_key=f"{ev.trajectory_id}/{ev.step.step_id}"))
                if self.metrics is not None:
                    self.metrics.canaries.labels(stream=stream).inc(len(evs))
        return out

    def _observe(self, events: list[tuple[StepEvent, Message]], verdicts: list[StepVerdict],
                 canary: list[bool], took: float) -> None:
        m = self.metrics
        assert m is not None
        if self.screener.live is not None:
            from dashboards.metrics import finite

            g = self.screener.live.gates[0]
            m.gate_threshold.labels(gate="L0", kind="live").set(g.threshold())
            m.gate_threshold.labels(gate="L0", kind="ceiling").set(finite(g.ceiling()))
        now_ms = time.time() * 1000
        for (e, msg), c in zip(events, canary, strict=True):
            m.steps.labels(stream=e.source, tier="0", canary="true" if c else "false").inc()
            m.tier_latency.labels(tier="0").observe(took)
            if msg.timestamp_ms > 0:
                m.score_latency.labels(tier="0").observe(max(0.0, now_ms - msg.timestamp_ms)
                                                         / 1000)
