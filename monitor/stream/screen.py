"""The screen stage (L0, L1): step events in; scores, escalations, labels and rollout verdicts out.

    consume  vigil.steps.rollout + vigil.steps.deployment (one micro-batch)
    score    Screener.screen(batch, through=1): L0 on every step, L1 on what L0 escalates
    decide   the policy's gates: tier 0, 1 or 2 for each step
    publish  Score(tier=0) for every step, Score(tier=1) for what L1 scored,
             Escalation(tier=2) with the trajectory so far, the step's label (replayed
             benchmark data, canaries) and, at an execution's final step, its RolloutVerdict

A batch that makes the models fail is retried one record at a time by the processor, so
only the poisoned record is dead-lettered; the stage's state changes only once the whole
batch is scored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dashboards.canary import canary_events, canary_of, is_canary
from monitor.screening import ScreenStep, screen_step_of
from monitor.stream.history import TrajectoryHistory, fit_trajectory
from monitor.stream.stats import Report, WorkerStats, clip01, finite, stderr
from monitor.stream.verdicts import RolloutVerdicts
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, StreamProcessor
from streams.records import (
    Escalation,
    GateState,
    LabelRecord,
    Record,
    RecordError,
    Score,
    Source,
    Step,
    StepEvent,
    decode,
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


class ScreenStage:
    """L0 on every step, L1 on what L0 escalates; tier-2 steps go to the escalations topic.

    With ``canaries``, every batch of real steps brings canary trajectories onto the same
    steps topic (``dashboards.canary``); they are screened like any step when they come
    back, but give no rollout verdict. Every labelled step (replayed benchmark data,
    canaries) has its label published to the labels topic for the recall stage.

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
        on_step: Callable[[ScreenedStep], None] | None = None,
        report: Report = stderr,
        gates_every_s: float = 10.0,
    ) -> None:
        self.screener = screener
        self.topics = topics
        self.stats = stats or WorkerStats()
        self.metrics = metrics
        self.canaries = canaries
        self.history = TrajectoryHistory(history_trajectories)
        self.rollouts = RolloutVerdicts(topics, self.stats, report, metrics=metrics,
                                        execution_timeout_s=execution_timeout_s,
                                        max_open_executions=max_open_executions)
        self.on_step = on_step
        self.report = report
        self.gates_every_s = gates_every_s  # how often live gate sketches are saved
        self._gates_saved = 0.0
        self._gates_restored_at = 0.0  # created_at of the sketches resumed from
        self._screened = False  # whether this process has screened a step yet
        self._group = "vigil-screen"
        self._l1_signals = set(screener.policy.config.tiers[1].signals)
        self._canaries_seen: OrderedDict[str, None] = OrderedDict()  # redelivered re-injections
        if metrics is not None:
            for k, g in enumerate(screener.policy.gates):
                metrics.gate_budget.labels(gate=f"L{k}").set(g.budget)
                metrics.gate_threshold.labels(gate=f"L{k}", kind="calibrated").set(g.threshold)

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 64) -> StreamProcessor:
        inputs: dict[str, type[Record]] = {self.topics.steps_rollout: StepEvent,
                                           self.topics.steps_deployment: StepEvent}
        self._group = group_id
        if self.screener.live is not None:
            # the stage reads its own saved sketches back, so the group's commits cover them
            # and a restart resumes from the last one committed (read_before_committed)
            inputs[self.topics.gates] = GateState
            self._restore_gates(bus, group_id)
        return StreamProcessor(
            bus,
            inputs,
            group_id,
            batch_handler=self.handle_batch,
            deadletter_topic=self.topics.deadletter,
            batch_size=batch_size,
            hold=self.hold,
            tick=self.tick,
            ensure_topics=self.topics.all(),
        )

    def _restore_gates(self, bus: Bus, group_id: str) -> None:
        """Resume the live gates from the newest sketches this group saved and committed."""
        assert self.screener.live is not None
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
                self.screener.live.restore(latest.state.encode())
                self._gates_restored_at = latest.created_at
        except Exception as e:  # noqa: BLE001 - start from the calibrated thresholds instead
            self.report(f"vigil stream: live gates start afresh ({type(e).__name__}: {e})")
            return
        if latest is not None:
            seen = [g.scores.n for g in self.screener.live.gates]
            self.report(f"vigil stream: live gates resumed from the sketches saved at "
                        f"{time.strftime('%H:%M:%S', time.localtime(latest.created_at))} "
                        f"({', '.join(f'L{k}: {n} scores' for k, n in enumerate(seen))})")

    def _resume(self, rec: GateState) -> None:
        """Before this process screens its first step, the newest sketches its group saved
        after the last commit (published with a batch's outputs, not yet read back) win;
        afterwards the stage's own sketches are newer."""
        live = self.screener.live
        if live is None or self._screened or rec.group != self._group:
            return
        if rec.created_at > self._gates_restored_at:
            live.restore(rec.state.encode())
            self._gates_restored_at = rec.created_at

    def _save_gates(self, now: float) -> list[Output]:
        """The live gates' sketches, every ``gates_every_s``, onto the gates topic."""
        live = self.screener.live
        if live is None or now - self._gates_saved < self.gates_every_s:
            return []
        self._gates_saved = now
        rec = GateState(group=self._group, state=live.to_bytes().decode(), created_at=now)
        return [Output(self.topics.gates, rec, key=self._group,
                       idempotency_key=f"{self._group}/gates/{now:.3f}")]

    def tick(self) -> list[Output]:
        """Verdicts, marked incomplete, for open executions that went quiet."""
        return self.rollouts.close_quiet(time.time())

    def hold(self) -> Positions:
        """The first offset of every open rollout execution: commits never pass it."""
        return self.rollouts.hold()

    def handle_batch(self, items: list[tuple[Record, Message]]) -> list[Output]:
        # consume: the batch's step events, each with its history
        events = self._fresh(items)
        if not events:
            return []
        self._screened = True
        pending: dict[str, OrderedDict[str, tuple[Step, str | None]]] = {}
        steps: list[ScreenStep] = []
        for e, _ in events:
            steps.append(screen_step_of(e, self.history.before(e, pending)))
            parent = e.meta.get("parent_step_id") if e.meta else None
            pending.setdefault(e.trajectory_id, OrderedDict())[e.step.step_id] = (
                e.step, parent if isinstance(parent, str) else None
            )
        # score and decide: one call of the models for the whole batch
        spent = dict(self.screener.timings)
        verdicts = self.screener.screen(steps, through=1)  # may raise: nothing changed yet
        now = time.time()
        canary = [is_canary(e.meta) for e, _ in events]
        # publish: scores, escalations and labels of every step
        outputs: list[Output] = []
        for (e, _m), st, v, c in zip(events, steps, verdicts, canary, strict=True):
            outputs.extend(self._outputs(e, st, v, now))
            outputs.extend(self._label(e, c, now))
            if self.on_step is not None:
                self.on_step(ScreenedStep(e, v))
        # state changes only once the whole batch is scored
        for tid, got in pending.items():
            self.history.add(tid, got.values())
        for e, _ in events:
            if e.final:  # the trajectory is over: its history is not needed any more
                self.history.forget(e.trajectory_id)
        for (e, m), v, c in zip(events, verdicts, canary, strict=True):
            if c:
                self._canaries_seen[f"{e.trajectory_id}/{e.step.step_id}"] = None
                if e.source == "rollout" and e.final and self.metrics is not None:
                    self.metrics.canaries_suppressed.labels(what="verdict").inc()
                continue  # a canary never reaches a trainer's admission
            outputs.extend(self.rollouts.track(e, m, v, now))
        while len(self._canaries_seen) > 100_000:
            self._canaries_seen.popitem(last=False)
        outputs.extend(self._inject(events, canary))
        outputs.extend(self._save_gates(now))
        self.stats.add_tiers((v.tier for v, c in zip(verdicts, canary, strict=True) if not c))
        self.stats.add("canaries", sum(canary))
        self.stats.add("canaries_to_review",
                       sum(v.tier >= 2 for v, c in zip(verdicts, canary, strict=True) if c))
        if self.metrics is not None:
            self._observe(events, verdicts, canary, spent)
        return outputs

    def _fresh(self, items: list[tuple[Record, Message]]) -> list[tuple[StepEvent, Message]]:
        """The batch's step events, less canary steps already screened (a redelivered batch
        upstream re-injects the same canary instances)."""
        events: list[tuple[StepEvent, Message]] = []
        for rec, m in items:
            if isinstance(rec, GateState):  # saved sketches read back
                self._resume(rec)
                continue
            if not isinstance(rec, StepEvent):  # pragma: no cover - the models map admits these
                raise TypeError(f"expected a step event, got {rec.kind}")
            if is_canary(rec.meta):
                key = f"{rec.trajectory_id}/{rec.step.step_id}"
                if key in self._canaries_seen:
                    continue
            events.append((rec, m))
        return events

    def _outputs(self, e: StepEvent, st: ScreenStep, v: StepVerdict, now: float) -> list[Output]:
        tid, sid = e.trajectory_id, e.step.step_id
        gates = self.screener.policy.gates
        signals = finite(v.signals)
        l0 = {k: x for k, x in signals.items() if k not in self._l1_signals}
        out: list[Output] = []

        def emit(record: Score | Escalation) -> None:
            topic = self.topics.scores if isinstance(record, Score) else self.topics.escalations
            out.append(Output(topic, record, key=tid, idempotency_key=record.idempotency_key))

        common: dict[str, Any] = {"trajectory_id": tid, "step_id": sid, "source": e.source,
                                  "created_at": now}
        emit(Score(tier=0, score=clip01(v.gate_scores[0]), flagged=v.tier >= 1, signals=l0,
                   **common))
        if v.tier >= 1 and len(v.gate_scores) > 1:
            emit(Score(tier=1, score=clip01(v.gate_scores[1]), flagged=v.tier >= 2,
                       signals=signals, **common))
        if v.tier >= 2:
            p = v.gate_scores[1]
            emit(
                Escalation(
                    tier=2,
                    score=clip01(p),
                    signals=signals,
                    reason=f"L1 gate {p:.3f} >= threshold {gates[1].threshold:.3f}",
                    trajectory=fit_trajectory(st.trajectory_so_far()),
                    **common,
                )
            )
        return out

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
                 canary: list[bool], spent: Mapping[str, float]) -> None:
        m = self.metrics
        assert m is not None
        took = {t: self.screener.timings.get(f"L{t}", 0.0) - spent.get(f"L{t}", 0.0)
                for t in (0, 1)}
        if self.screener.live is not None:
            for k, t in enumerate(self.screener.live.thresholds()):
                m.gate_threshold.labels(gate=f"L{k}", kind="live").set(t)
        for (e, _), v, c in zip(events, verdicts, canary, strict=True):
            flag = "true" if c else "false"
            for t in range(min(v.tier, 2) + 1):
                m.steps.labels(stream=e.source, tier=str(t), canary=flag).inc()
            m.tier_latency.labels(tier="0").observe(took[0])
            if v.tier >= 1:
                m.tier_latency.labels(tier="1").observe(took[1])
            if v.tier >= 2:
                m.escalations.labels(stream=e.source, tier="2").inc()
