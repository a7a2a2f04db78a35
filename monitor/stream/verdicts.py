"""Rollout verdicts: the probe stage's open executions, held until their final step, then
one :class:`~streams.records.RolloutVerdict` each for the trainer's admission.

An execution holds commits (its first offset per partition) while it is open, so a crash
screens it again whole. One that goes quiet (no step for ``execution_timeout_s`` by the
wall clock or by the producer times of later records on its partition), or is the oldest
of more than ``max_open_executions``, is closed with a verdict marked ``incomplete``; a
step that arrives after that gets a second verdict keyed ``.../verdict/after-timeout``.

With the policy's trajectory section, a verdict also carries the execution's
``trajectory_score`` (:mod:`monitor.trajectory`, over every step's final score at this
stage, kept in constant memory) and quarantines an execution whose score reaches the
trajectory threshold: the calibrated one, or with ``--adapt`` the live one, which flags the
trajectory budget of the executions this stage closed (:class:`monitor.adaptive.LiveGates`).

Deployment trajectories have no final step, so no verdict closes them: :class:`RunningRuns`
keeps each one's trajectory score as its steps come (the same aggregation, constant memory,
the last ``max_runs`` runs) and the first time it reaches the trajectory threshold at a step
no gate passed up, sends that step with the run so far to L2 (an
:class:`~streams.records.Escalation` the review stage judges like any other), once a run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from monitor.stream.history import fit_trajectory
from monitor.stream.stats import Report, WorkerStats, clip01, finite
from monitor.trajectory import RunningScores
from streams.bus import Message
from streams.config import Topics
from streams.processor import Output, Positions
from streams.records import Escalation, RolloutVerdict, StepEvent
from streams.rollouts import QuietExecutions

if TYPE_CHECKING:
    from dashboards.metrics import WorkerMetrics
    from monitor.adaptive import LiveGates
    from monitor.pipeline import StepVerdict
    from monitor.screening import ScreenStep
    from monitor.trajectory import TrajectoryAggregation


@dataclass
class _Execution:
    """An open rollout execution: where its steps start, and what screening found so far."""

    first: dict[tuple[str, int], int] = field(default_factory=dict)
    score: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)  # step id -> why it counts
    after_timeout: bool = False  # steps of an execution that had timed out already
    steps: RunningScores = field(default_factory=RunningScores)  # for the trajectory score


class RolloutVerdicts:
    """The open executions of one stage and the verdicts that close them (``publish``: the
    probe stage; the screen stage keeps them for the commit hold alone)."""

    def __init__(
        self,
        topics: Topics,
        stats: WorkerStats,
        report: Report,
        *,
        metrics: WorkerMetrics | None = None,
        execution_timeout_s: float = 600.0,
        max_open_executions: int = 10_000,
        publish: bool = True,
        trajectory: TrajectoryAggregation | None = None,
        live: LiveGates | None = None,
    ) -> None:
        """``trajectory``: the policy's trajectory section (None: no trajectory score);
        ``live``: the stage's live gates, whose trajectory threshold then decides."""
        self.topics = topics
        self.trajectory = trajectory
        self.live = live
        self.publish = publish  # False: the open executions' commit hold only (L0 stage)
        self.stats = stats
        self.report = report
        self.metrics = metrics
        self.execution_timeout_s = execution_timeout_s
        self.max_open_executions = max_open_executions
        self._open: dict[str, _Execution] = {}
        self._timed_out: OrderedDict[str, None] = OrderedDict()  # executions closed early
        self._quiet = QuietExecutions(execution_timeout_s, max_open_executions)

    def hold(self) -> Positions:
        """The first offset of every open rollout execution: commits never pass it."""
        held: dict[tuple[str, int], int] = {}
        for ex in self._open.values():
            for tp, off in ex.first.items():
                held[tp] = min(held.get(tp, off), off)
        return held

    def trajectory_threshold(self) -> float:
        """The threshold a trajectory score is flagged at: live (``--adapt``) or calibrated."""
        assert self.trajectory is not None
        live = None if self.live is None else self.live.trajectory_threshold()
        return self.trajectory.threshold if live is None else live

    def close_quiet(self, now: float) -> list[Output]:
        """Verdicts, marked incomplete, for open executions that went quiet."""
        return [o for eid in self._quiet.quiet() for o in self.close(eid, now, timed_out=True)]

    def track(self, e: StepEvent, m: Message, v: StepVerdict, now: float) -> list[Output]:
        """Count one screened rollout step; its execution's verdict if the step is final."""
        if e.source != "rollout":
            return []
        eid = str(e.meta.get("execution_id") or e.trajectory_id)
        tp = (m.topic, m.partition)
        ex = self._open.setdefault(eid, _Execution(after_timeout=eid in self._timed_out))
        ex.first[tp] = min(ex.first.get(tp, m.offset), m.offset)
        self._quiet.touch(eid, m)
        ex.score = max(ex.score, clip01(v.score))
        ex.steps.add(clip01(v.score))
        if v.tier >= 2:
            ex.reasons[e.step.step_id] = (
                f"step {e.step.step_id} reached L{v.tier} (score {v.score:.3f})"
            )
        out: list[Output] = []
        if e.final:
            out.extend(self.close(eid, now, incomplete=bool(e.meta.get("incomplete"))))
        for old in self._quiet.quiet(keep={eid}):  # too many open, or gone quiet
            out.extend(self.close(old, now, timed_out=True))
        return out

    def close(self, eid: str, now: float, *, timed_out: bool = False,
              incomplete: bool = False) -> list[Output]:
        """The verdict of execution ``eid``; it holds commits no more."""
        ex = self._open.pop(eid)
        self._quiet.forget(eid)
        if not self.publish:
            return []
        partial = timed_out or incomplete or ex.after_timeout
        if timed_out:
            self._timed_out[eid] = None
            while len(self._timed_out) > 100_000:
                self._timed_out.popitem(last=False)
            if self.metrics is not None:
                self.metrics.rollout_timeouts.labels(stage="probe").inc()
        reasons = list(ex.reasons.values())
        traj_score = None
        if self.trajectory is not None and ex.steps.n:
            traj_score = self.trajectory.score(ex.steps)
            threshold = self.trajectory_threshold()
            if traj_score >= threshold:
                reasons.append(f"trajectory score {traj_score:.3f} >= threshold {threshold:.3f}")
            if self.live is not None:
                self.live.observe_trajectories([traj_score], ["real"])
        verdict = RolloutVerdict(
            execution_id=eid,
            quarantine=bool(reasons),
            score=ex.score,
            reasons=reasons,
            step_ids=list(ex.reasons),
            created_at=now,
            incomplete=partial,
            trajectory_score=traj_score,
        )
        # a verdict on the steps after a timeout is a second verdict, not a repeat
        key = f"{eid}/verdict" + ("/after-timeout" if ex.after_timeout else "")
        self.stats.add("verdicts")
        if verdict.quarantine:
            self.stats.add("quarantined")
        if self.metrics is not None:
            self.metrics.verdicts.labels(quarantine=str(verdict.quarantine).lower()).inc()
        why = ""
        if timed_out:
            why = (f" [incomplete: no step for {self.execution_timeout_s:.0f} s, or over "
                   f"{self.max_open_executions} open executions]")
        elif partial:
            why = " [incomplete]"
        self.report(
            f"rollout {eid}: {'QUARANTINE' if verdict.quarantine else 'admit'}{why}"
            + (f" ({'; '.join(verdict.reasons[:3])})" if verdict.reasons else "")
        )
        return [Output(self.topics.verdicts_rollout, verdict, key=eid, idempotency_key=key)]


@dataclass
class _Run:
    steps: RunningScores = field(default_factory=RunningScores)
    sent: bool = False  # the run reached L2 by its trajectory score (or a step of it did)


class RunningRuns:
    """The running trajectory score of each deployment run this stage sees; the run goes to
    L2 once, the first time the score reaches the trajectory threshold. A run already at L2
    by a step's own gate counts as sent: the judge reads the run so far with that step."""

    def __init__(self, topics: Topics, trajectory: TrajectoryAggregation, threshold:
                 Callable[[], float], stats: WorkerStats, *, max_runs: int = 10_000) -> None:
        self.topics, self.trajectory, self.threshold = topics, trajectory, threshold
        self.stats, self.max_runs = stats, max_runs
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def track(self, e: StepEvent, st: ScreenStep, v: StepVerdict, now: float) -> list[Output]:
        """Count one screened step of a run that is not a rollout execution; the run's
        escalation to L2 if its trajectory score has just reached the threshold."""
        if e.source == "rollout":  # an execution: its verdict closes it
            return []
        run = self._runs.pop(e.trajectory_id, None) or _Run()
        self._runs[e.trajectory_id] = run
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
        run.steps.add(clip01(v.score))
        if run.sent:
            return []
        if v.tier >= 2:
            run.sent = True
            return []
        score, threshold = self.trajectory.score(run.steps), self.threshold()
        if score < threshold:
            return []
        run.sent = True
        self.stats.add("runs_to_review")
        up = Escalation(
            trajectory_id=e.trajectory_id, step_id=st.step_id, source=e.source, tier=2,
            score=clip01(score), signals=finite(v.signals), created_at=now,
            reason=f"trajectory score {score:.3f} >= threshold {threshold:.3f} over "
                   f"{run.steps.n} steps",
            trajectory=fit_trajectory(st.trajectory_so_far()))
        return [Output(self.topics.escalations, up, key=e.trajectory_id,
                       idempotency_key=up.idempotency_key)]
