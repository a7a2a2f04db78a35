"""The review stage (L2, L3): tier-2 escalations in; L2 scores, tier-3 escalations and pages out.

    consume  vigil.escalations (tier 2 only; tier 3 is this stage's own output)
    score    Screener.review(batch): the L2 reviewer on each step, with its L0+L1 signals
    decide   the L2 gate: does a human see it?
    publish  Score(tier=2) for every review, Escalation(tier=3) for what passes, and a page
             (POST {paging}/api/v1/events) with the harm attribution of the trajectory

Canaries that reach L3 are counted, never paged. When the paging service cannot be
reached (:class:`~monitor.stream.paging.PagingUnavailable`) the batch is not committed:
it is consumed again later, and the service's dedup key keeps a redelivered step from
paging twice.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dashboards.canary import is_canary
from monitor.screening import ScreenStep
from monitor.stream.paging import PageRejected, PagingClient, page_event
from monitor.stream.stats import Report, WorkerStats, clip01, finite, stderr
from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, StreamProcessor
from streams.records import Escalation, Record, Score

if TYPE_CHECKING:
    from dashboards.metrics import WorkerMetrics
    from monitor.pipeline import Screener, StepVerdict


class ReviewStage:
    """Reviews tier-2 escalations (L2); a step the gate passes to L3 pages a human."""

    def __init__(
        self,
        screener: Screener,
        topics: Topics,
        *,
        paging: PagingClient | None,
        stats: WorkerStats | None = None,
        metrics: WorkerMetrics | None = None,
        report: Report = stderr,
    ) -> None:
        self.screener = screener
        self.topics = topics
        self.paging = paging
        self.stats = stats or WorkerStats()
        self.metrics = metrics
        self.report = report
        if metrics is not None:  # zero series, so dashboards show "0 reviews", not "no data"
            rv = screener.reviewer
            metrics.init_reviewer(str(getattr(getattr(rv, "config", None), "backend", "none")))

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 16) -> StreamProcessor:
        return StreamProcessor(
            bus,
            {self.topics.escalations: Escalation},
            group_id,
            batch_handler=self.handle_batch,
            deadletter_topic=self.topics.deadletter,
            batch_size=batch_size,
            max_record_bytes=8 * 1_048_576,  # an escalation carries its trajectory
            ensure_topics=self.topics.all(),
        )

    def handle_batch(self, items: list[tuple[Record, Message]]) -> list[Output]:
        """Review each tier-2 escalation; page the ones the L3 gate passes, except canaries
        (their tier-2 score says they reached L3; no human sees them)."""
        # consume
        todo = [e for e in (_tier2(rec) for rec, _ in items) if e is not None]
        if not todo:
            return []
        # score and decide
        steps = [ScreenStep.from_trajectory_so_far(e.trajectory) for e in todo]  # type: ignore[arg-type]
        spent = self.screener.timings.get("L2", 0.0)
        verdicts = self.screener.review(steps, [e.signals for e in todo])
        took = self.screener.timings.get("L2", 0.0) - spent
        thresholds = [g.threshold for g in self.screener.policy.gates]
        now = time.time()
        # publish: scores and tier-3 escalations, then the pages
        outputs: list[Output] = []
        pages: list[tuple[Escalation, StepVerdict]] = []
        for e, v in zip(todo, verdicts, strict=True):
            common: dict[str, Any] = {"trajectory_id": e.trajectory_id, "step_id": e.step_id,
                                      "source": e.source, "created_at": now}
            signals = finite(v.signals)
            p = v.gate_scores[2] if len(v.gate_scores) > 2 else v.score
            score = Score(tier=2, score=clip01(p), flagged=v.tier >= 3, signals=signals,
                          **common)
            outputs.append(Output(self.topics.scores, score, key=e.trajectory_id,
                                  idempotency_key=score.idempotency_key))
            canary = e.trajectory is not None and is_canary(e.trajectory.meta)
            if self.metrics is not None:
                self._observe(e, v, canary, took)
            if v.tier >= 3 and canary:
                if self.metrics is not None:
                    self.metrics.canaries_suppressed.labels(what="page").inc()
            elif v.tier >= 3:
                up = Escalation(tier=3, score=clip01(p), signals=signals,
                                reason=f"L2 gate {p:.3f} >= threshold {thresholds[2]:.3f}",
                                trajectory=e.trajectory, **common)
                outputs.append(Output(self.topics.escalations, up, key=e.trajectory_id,
                                      idempotency_key=up.idempotency_key))
                pages.append((e, v))
        self._page(pages, thresholds)
        self.stats.add("reviewed", len(todo))
        self.stats.add("pages", len(pages))
        return outputs

    def _page(self, pages: list[tuple[Escalation, StepVerdict]], thresholds: list[float]) -> None:
        """One page per tier-3 step; a PagingUnavailable leaves the batch uncommitted."""
        if self.paging is None:
            if pages:
                self.report(f"{len(pages)} step(s) reached L3 but no paging service is configured")
            return
        attributions = self._attribute([e for e, _ in pages])
        for (e, v), att in zip(pages, attributions, strict=True):
            try:
                msg = self.paging.trigger(page_event(e, v, thresholds, attribution=att))
            except PageRejected as exc:
                if att is None:
                    raise
                self.report(f"the paging service refused {e.trajectory_id}/{e.step_id} "
                            f"with its harm attribution ({exc}): paging without it")
                msg = self.paging.trigger(page_event(e, v, thresholds))
            self.report(f"PAGE {e.trajectory_id}/{e.step_id} (harm {v.score:.2f}): {msg}")
            if self.metrics is not None:
                result = "deduplicated" if "dedup" in msg.lower() else "opened"
                self.metrics.pages.labels(result=result).inc()

    def _attribute(self, pages: list[Escalation]) -> list[dict[str, Any] | None]:
        """Which turn and tokens moved each paged trajectory toward harm (MPO credit
        assignment with the world model as critic), one model call for the batch; None
        each without a world model. A failure is reported and the pages go out without it."""
        if not pages:
            return []
        from monitor.rlhealth.attribution import page_attributions

        try:
            trajectories = [e.trajectory for e in pages if e.trajectory is not None]
            if len(trajectories) != len(pages):  # pragma: no cover - handle_batch checked
                raise ValueError("a paged escalation carries no trajectory")
            return page_attributions(self.screener, trajectories)
        except Exception as exc:  # the attribution is an aid: it never holds a page back
            self.report(f"harm attribution failed, paging without it: {type(exc).__name__}: {exc}")
            return [None for _ in pages]

    def _observe(self, e: Escalation, v: StepVerdict, canary: bool, took: float) -> None:
        m = self.metrics
        assert m is not None
        m.tier_latency.labels(tier="2").observe(took)
        if v.tier >= 3:
            m.steps.labels(stream=e.source, tier="3", canary=str(canary).lower()).inc()
            if not canary:
                m.escalations.labels(stream=e.source, tier="3").inc()
        r = v.review
        if r is not None:
            m.reviews.labels(backend=r.backend, outcome="error" if r.error else "ok").inc()
            if r.cost:
                m.reviewer_cost.labels(backend=r.backend).inc(r.cost)


def _tier2(rec: Record) -> Escalation | None:
    """A tier-2 escalation to review; None for tier 3 (this stage's own output). One that
    carries no trajectory ending at its step is a bad record (ValueError)."""
    if not isinstance(rec, Escalation):  # pragma: no cover - the models map admits these
        raise TypeError(f"expected an escalation, got {rec.kind}")
    if rec.tier != 2:
        return None
    if rec.trajectory is None or not rec.trajectory.steps:
        raise ValueError(
            f"tier-2 escalation of {rec.trajectory_id}/{rec.step_id} carries no trajectory"
        )
    if rec.trajectory.steps[-1].step_id != rec.step_id:
        raise ValueError(
            f"tier-2 escalation of {rec.trajectory_id}/{rec.step_id}: its trajectory "
            f"ends at step {rec.trajectory.steps[-1].step_id!r}"
        )
    return rec
