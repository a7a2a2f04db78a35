"""The probe stage (L1): steps with their L0 verdicts in; tier-1 scores, escalations, rollout
verdicts out.

    consume  vigil.steps.l0 (one micro-batch of L0Step records, from the screen stage)
    score    Screener.screen_escalated(...): L1 on the steps L0 escalated, gate 1 decided
    publish  Score(tier=1) for what L1 scored, Escalation(tier=2) with the trajectory so
             far, and, at a rollout execution's final step, its RolloutVerdict; a
             deployment run whose trajectory score reaches the threshold goes to L2 once
             (RunningRuns)

Every step comes through, escalated or not, so the stage keeps each trajectory's history
(as the screen stage does) and sees every step of a rollout execution; the models run on
the escalated ones only. A batch that makes them fail is retried one record at a time by
the processor, so only the poisoned record is dead-lettered; the stage's state changes
only once the whole batch is scored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dashboards.canary import is_canary
from monitor.pipeline import StepVerdict
from monitor.screening import ScreenStep
from monitor.stream.gates import GateSketches, stage_processor
from monitor.stream.history import fit_trajectory
from monitor.stream.screen import ScreenedStep, StepHistories
from monitor.stream.stats import Report, WorkerStats, clip01, finite, stderr
from monitor.stream.verdicts import RolloutVerdicts, RunningRuns
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, StreamProcessor
from streams.records import Escalation, GateState, L0Step, Record, Score

if TYPE_CHECKING:
    from dashboards.metrics import WorkerMetrics
    from monitor.pipeline import Screener


class ProbeStage:
    """L1 on what L0 escalated; tier-2 steps go to the escalations topic; rollout verdicts.

    Use :meth:`processor` for the ``StreamProcessor`` over ``vigil.steps.l0``.
    """

    def __init__(
        self,
        screener: Screener,
        topics: Topics,
        *,
        stats: WorkerStats | None = None,
        metrics: WorkerMetrics | None = None,
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
        self.histories = StepHistories(history_trajectories)
        self.rollouts = RolloutVerdicts(topics, self.stats, report, metrics=metrics,
                                        execution_timeout_s=execution_timeout_s,
                                        max_open_executions=max_open_executions,
                                        trajectory=screener.policy.trajectory,
                                        live=screener.live)
        self.runs = (None if screener.policy.trajectory is None else
                     RunningRuns(topics, screener.policy.trajectory,
                                 self.rollouts.trajectory_threshold, self.stats,
                                 max_runs=history_trajectories))
        self.on_step = on_step
        self.report = report
        self.sketches = (None if screener.live is None else
                         GateSketches(screener.live, topics, report, every_s=gates_every_s))

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 64) -> StreamProcessor:
        inputs: dict[str, type[Record]] = {self.topics.steps_l0: L0Step}
        return stage_processor(bus, group_id, inputs, topics=self.topics,
                               sketches=self.sketches, handler=self.handle_batch,
                               hold=self.hold, tick=self.tick, batch_size=batch_size)

    def tick(self) -> list[Output]:
        """Verdicts, marked incomplete, for open executions that went quiet."""
        return self.rollouts.close_quiet(time.time())

    def hold(self) -> Positions:
        """The first offset of every open rollout execution: commits never pass it."""
        return self.rollouts.hold()

    def handle_batch(self, items: list[tuple[Record, Message]]) -> list[Output]:
        # consume: the batch's steps with their L0 verdicts, each with its history
        got: list[tuple[L0Step, Message]] = []
        for rec, m in items:
            if isinstance(rec, GateState):  # saved sketches read back
                if self.sketches is not None:
                    self.sketches.read_back(rec)
            elif isinstance(rec, L0Step):
                got.append((rec, m))
            else:  # pragma: no cover - the models map admits these only
                raise TypeError(f"expected a step with its L0 verdict, got {rec.kind}")
        if not got:
            return []
        if self.sketches is not None:
            self.sketches.screened = True
        events = [r.event for r, _ in got]
        steps, pending = self.histories.steps(events)
        # score and decide: one call of the L1 models for the escalated steps
        up = [i for i, (r, _) in enumerate(got) if r.escalate]
        spent = self.screener.timings.get("L1", 0.0)
        scored = self.screener.screen_escalated([steps[i] for i in up],
                                                [got[i][0].signals for i in up], through=1)
        verdicts = [self._tier0(r) for r, _ in got]  # may raise above: nothing changed yet
        for i, v in zip(up, scored, strict=True):
            verdicts[i] = v
        now = time.time()
        canary = [is_canary(e.meta) for e in events]
        # publish: tier-1 scores and escalations
        outputs: list[Output] = []
        for e, st, v in zip(events, steps, verdicts, strict=True):
            outputs.extend(self._outputs(e.trajectory_id, e.source, st, v, now))
            if self.on_step is not None:
                self.on_step(ScreenedStep(e, v))
        # state changes only once the whole batch is scored
        self.histories.commit(events, pending)
        for (r, m), st, v, c in zip(got, steps, verdicts, canary, strict=True):
            if self.runs is not None and not c:
                outputs.extend(self.runs.track(r.event, st, v, now))
            if c:
                if r.event.source == "rollout" and r.event.final and self.metrics is not None:
                    self.metrics.canaries_suppressed.labels(what="verdict").inc()
                continue  # a canary never reaches a trainer's admission
            outputs.extend(self.rollouts.track(r.event, m, v, now))
        if self.sketches is not None:
            outputs.extend(self.sketches.save(now))
        self.stats.add_tiers((v.tier for v, c in zip(verdicts, canary, strict=True) if not c))
        self.stats.add("canaries", sum(canary))
        self.stats.add("canaries_to_review",
                       sum(v.tier >= 2 for v, c in zip(verdicts, canary, strict=True) if c))
        if self.metrics is not None:
            self._observe(got, verdicts, canary, self.screener.timings.get("L1", 0.0) - spent)
        return outputs

    def _tier0(self, r: L0Step) -> StepVerdict:
        """The verdict of a step L0 kept (or that L1 has not scored yet)."""
        policy = self.screener.policy
        return StepVerdict(trajectory_id=r.event.trajectory_id, step_id=r.event.step.step_id,
                           tier=0, score=r.score, flagged=policy.config.flag_tier <= 0,
                           signals=dict(r.signals), gate_scores=(r.score,))

    def _outputs(self, tid: str, source: Any, st: ScreenStep, v: StepVerdict, now: float
                 ) -> list[Output]:
        if v.tier < 1 or len(v.gate_scores) < 2:
            return []
        signals = finite(v.signals)
        common: dict[str, Any] = {"trajectory_id": tid, "step_id": st.step_id, "source": source,
                                  "created_at": now}
        records: list[Score | Escalation] = [
            Score(tier=1, score=clip01(v.gate_scores[1]), flagged=v.tier >= 2, signals=signals,
                  **common)]
        if v.tier >= 2:
            p = v.gate_scores[1]
            gate = self.screener.policy.gates[1]
            records.append(Escalation(
                tier=2, score=clip01(p), signals=signals,
                reason=f"L1 gate {p:.3f} >= threshold {gate.threshold:.3f}",
                trajectory=fit_trajectory(st.trajectory_so_far()), **common))
        return [Output(self.topics.scores if isinstance(r, Score) else self.topics.escalations,
                       r, key=tid, idempotency_key=r.idempotency_key) for r in records]

    def _observe(self, got: list[tuple[L0Step, Message]], verdicts: list[StepVerdict],
                 canary: list[bool], took: float) -> None:
        m = self.metrics
        assert m is not None
        if self.screener.live is not None:
            from dashboards.metrics import finite

            for k, g in enumerate(self.screener.live.gates):
                if k:
                    m.gate_threshold.labels(gate=f"L{k}", kind="live").set(g.threshold())
                    m.gate_threshold.labels(gate=f"L{k}", kind="ceiling").set(finite(g.ceiling()))
            if (tg := self.screener.live.trajectory) is not None:
                m.gate_threshold.labels(gate="trajectory", kind="live").set(tg.threshold())
                m.gate_threshold.labels(gate="trajectory", kind="ceiling").set(
                    finite(tg.ceiling()))
        now_ms = time.time() * 1000
        for (r, _), v, c in zip(got, verdicts, canary, strict=True):
            flag = "true" if c else "false"
            for t in range(1, min(v.tier, 2) + 1):
                m.steps.labels(stream=r.event.source, tier=str(t), canary=flag).inc()
            if v.tier >= 1:
                m.tier_latency.labels(tier="1").observe(took)
                if r.produced_ms > 0:  # produce -> tier-1 score, across both stages
                    m.score_latency.labels(tier="1").observe(
                        max(0.0, now_ms - r.produced_ms) / 1000)
            if v.tier >= 2:
                m.escalations.labels(stream=r.event.source, tier="2").inc()
