"""The streaming worker (``monitor stream``): steps in, scores, escalations, pages and verdicts out.

Three stages, each a consumer group of its own, so each scales by running more
members (threads of one ``monitor stream``, or processes on many machines)::

    vigil.tito.calls/executions ─ reassemble ─> vigil.steps.rollout ─┐
                                          vigil.steps.deployment ─────┴─ screen (L0, L1)
        ├─> vigil.scores            Score(tier=0) for every step, Score(tier=1) for what L1 scored
        ├─> vigil.escalations       Escalation(tier=2) with the trajectory so far
        └─> vigil.verdicts.rollout  one RolloutVerdict per execution (trainer admission)
    vigil.escalations (tier 2) ─ review (L2) ─> Score(tier=2), Escalation(tier=3),
                                                and a page: POST {paging}/api/v1/events

* **Micro-batches.** The screen stage scores each polled batch in one call of the
  models (``Screener.screen(batch, through=1)``); a batch that makes them fail is
  retried one record at a time, so only the poisoned record is dead-lettered.
* **At least once** (DESIGN §2.4). Inputs are committed only after every output
  of their batch is acknowledged by the broker; outputs carry the idempotency key
  ``trajectory/step/tier`` (a verdict: ``execution/verdict``); a page's dedup key is
  ``trajectory/step``, and the paging service never opens a second page for a
  known key, so a redelivered step never pages twice. When the paging service
  cannot be reached the batch is not committed: it is consumed again later.
* **State, and what a restart loses.** The screen stage keeps, in memory, the
  recent steps of the last ``history_trajectories`` trajectories (LRU) to give
  each step its history. Rollout executions are held: the stage never commits
  past the first step of an execution whose ``final`` step it has not seen, so
  after a crash or a rebalance the whole open execution is screened again and its
  history and quarantine verdict are rebuilt exactly. An execution whose final
  step does not come within ``execution_timeout_s`` of its newest step (by the
  wall clock, or by the producer times of later steps on its partition), or that
  is the oldest of more than ``max_open_executions``, gets a verdict marked
  ``incomplete`` and stops holding commits. Deployment trajectories are
  not held (they may never end): after a restart or a rebalance, the next steps of
  a trajectory in flight are screened with only the steps seen since as history.
* **Nothing goes back to the agent.** The worker writes only the scores,
  escalations, rollout-verdict and dead-letter topics and the paging service; no
  topic or API a monitored agent reads (DESIGN §3).
* **Shutdown.** On SIGTERM or SIGINT every stage stops polling, finishes its
  batch, flushes, commits and leaves its group.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, ProcessorStats, RetryLater, StreamProcessor
from streams.records import (
    Escalation,
    LabelRecord,
    Record,
    RecordError,
    RolloutVerdict,
    Score,
    Source,
    Step,
    StepEvent,
    Trajectory,
    decode,
)
from streams.rollouts import QuietExecutions, TreeSummary, reassembly_processor

if TYPE_CHECKING:
    from dashboards.canary import CanaryInjector
    from dashboards.ground_truth import LabelJoin
    from dashboards.metrics import WorkerMetrics
    from monitor.pipeline import Screener, StepVerdict
    from monitor.screening import ScreenStep
    from streams.health import BrokerState

Report = Callable[[str], None]
ROLES = ("screen", "review", "reassemble", "recall")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _finite(signals: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in signals.items() if math.isfinite(float(v))}


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, float(x))) if math.isfinite(x) else 0.0


ESCALATION_MAX_BYTES = 512 * 1024  # an escalation's trajectory is cut to fit the bus


def fit_trajectory(traj: Trajectory, max_bytes: int = ESCALATION_MAX_BYTES) -> Trajectory:
    """``traj`` cut to at most about ``max_bytes`` of JSON, for an escalation record: the
    oldest steps go first, then the texts of what is left are cut (``meta.vigil_cut``
    says so). The step being escalated is always kept."""
    size = len(traj.model_dump_json())
    if size <= max_bytes:
        return traj
    steps = list(traj.steps)
    while len(steps) > 1 and size > max_bytes:
        size -= len(steps[0].model_dump_json())
        steps.pop(0)
    if size > max_bytes:
        texts = max(1, (max_bytes - 4096) // 8)  # task + 3 texts a step, 2 steps' worth

        def cut(text: str) -> str:
            return text if len(text) <= texts else text[:texts] + " [... cut by vigil]"

        fitted = []
        for st in steps:
            upd: dict[str, Any] = {
                "observation": st.observation.model_copy(update={"text": cut(st.observation.text)}),
                "action": st.action.model_copy(update={"text": cut(st.action.text)}),
            }
            if st.result is not None:
                upd["result"] = st.result.model_copy(update={"text": cut(st.result.text)})
            fitted.append(st.model_copy(update=upd))
        steps = fitted
    return traj.model_copy(update={"steps": steps, "task": traj.task[: 4 * max_bytes // 8],
                                   "meta": {**traj.meta, "vigil_cut": True}})


# --- stats ------------------------------------------------------------------------------


@dataclass
class WorkerStats:
    """What the worker did (thread-safe counters, printed as the progress line)."""

    steps: int = 0
    reached: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # steps reaching tier k
    reviewed: int = 0
    pages: int = 0
    verdicts: int = 0
    quarantined: int = 0
    trees: int = 0
    canaries: int = 0  # canary steps screened
    canaries_to_review: int = 0  # canary steps that reached L2 (the reviewer sees them too)
    dead_letters: dict[str, int] = field(default_factory=dict)  # per stage
    retries: dict[str, int] = field(default_factory=dict)  # per stage: batches consumed again
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_tiers(self, tiers: Iterable[int]) -> None:
        with self._lock:
            for t in tiers:
                self.steps += 1
                for k in range(min(t, 3) + 1):
                    self.reached[k] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def sync(self, stage: str, proc: ProcessorStats) -> None:
        with self._lock:
            self.dead_letters[stage] = proc.dead_lettered
            self.retries[stage] = proc.retries

    def line(self) -> str:
        with self._lock:
            r = self.reached
            dl = sum(self.dead_letters.values())
            retried = sum(self.retries.values())
            return (
                f"vigil stream: screened {self.steps} steps (L0 {r[0]}, L1 {r[1]}, L2 {r[2]}, "
                f"L3 {r[3]}), reviewed {self.reviewed}, {self.pages} pages, "
                f"{self.verdicts} rollout verdicts ({self.quarantined} quarantined), "
                f"{dl} dead letters" + (f", {retried} batches retried" if retried else "")
                + (f", {self.canaries} canary steps" if self.canaries else "")
            )


# --- history ----------------------------------------------------------------------------


class TrajectoryHistory:
    """The recent steps of the last ``max_trajectories`` trajectories (LRU), in memory.

    A rollout step names its parent (``meta.parent_step_id``, from the tree
    reconstruction): its history is the chain of its ancestors. Any other step's
    history is the steps of its trajectory that arrived before it.
    """

    def __init__(self, max_trajectories: int = 10_000, max_steps: int = 64) -> None:
        self.max_trajectories = max_trajectories
        self.max_steps = max_steps
        self._steps: OrderedDict[str, OrderedDict[str, tuple[Step, str | None]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._steps)

    def before(
        self, event: StepEvent, pending: Mapping[str, Mapping[str, tuple[Step, str | None]]] = {}
    ) -> list[Step]:
        """The earlier steps of ``event``'s trajectory, oldest first (``pending``: steps of
        the current batch not yet added)."""
        from monitor.screening import HISTORY

        tid = event.trajectory_id
        known: dict[str, tuple[Step, str | None]] = {
            **self._steps.get(tid, {}), **pending.get(tid, {})
        }
        parent = event.meta.get("parent_step_id") if event.meta else None
        if "parent_step_id" in (event.meta or {}):
            chain: list[Step] = []
            while isinstance(parent, str) and parent in known and len(chain) < HISTORY:
                step, parent = known[parent]
                chain.append(step)
            return chain[::-1]
        earlier = [s for s, _ in known.values() if s.step_id != event.step.step_id]
        return earlier[-HISTORY:]

    def add(self, trajectory_id: str, steps: Iterable[tuple[Step, str | None]]) -> None:
        got = self._steps.pop(trajectory_id, None) or OrderedDict()
        for step, parent in steps:
            got.pop(step.step_id, None)
            got[step.step_id] = (step, parent)
        while len(got) > self.max_steps:
            got.popitem(last=False)
        self._steps[trajectory_id] = got
        while len(self._steps) > self.max_trajectories:
            self._steps.popitem(last=False)

    def forget(self, trajectory_id: str) -> None:
        self._steps.pop(trajectory_id, None)


# --- the screen stage (L0, L1) ----------------------------------------------------------


@dataclass
class _Execution:
    """An open rollout execution: where its steps start, and what screening found so far."""

    first: dict[tuple[str, int], int] = field(default_factory=dict)
    score: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)  # step id -> why it counts
    after_timeout: bool = False  # steps of an execution that had timed out already


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
        report: Report = _stderr,
    ) -> None:
        self.screener = screener
        self.topics = topics
        self.stats = stats or WorkerStats()
        self.metrics = metrics
        self.canaries = canaries
        self.history = TrajectoryHistory(history_trajectories)
        self.max_open_executions = max_open_executions
        self.execution_timeout_s = execution_timeout_s
        self._timed_out: OrderedDict[str, None] = OrderedDict()  # executions closed early
        self._quiet = QuietExecutions(execution_timeout_s, max_open_executions)
        self.on_step = on_step
        self.report = report
        self._open: dict[str, _Execution] = {}
        self._l1_signals = set(screener.policy.config.tiers[1].signals)
        self._canaries_seen: OrderedDict[str, None] = OrderedDict()  # redelivered re-injections

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 64) -> StreamProcessor:
        return StreamProcessor(
            bus,
            {self.topics.steps_rollout: StepEvent, self.topics.steps_deployment: StepEvent},
            group_id,
            batch_handler=self.handle_batch,
            deadletter_topic=self.topics.deadletter,
            batch_size=batch_size,
            hold=self.hold,
            tick=self.tick,
            ensure_topics=self.topics.all(),
        )

    def tick(self) -> list[Output]:
        """Verdicts, marked incomplete, for open executions that went quiet."""
        now = time.time()
        return [o for eid in self._quiet.quiet() for o in self._close(eid, now, timed_out=True)]

    def hold(self) -> Positions:
        """The first offset of every open rollout execution: commits never pass it."""
        held: dict[tuple[str, int], int] = {}
        for ex in self._open.values():
            for tp, off in ex.first.items():
                held[tp] = min(held.get(tp, off), off)
        return held

    def _fresh(self, items: list[tuple[Record, Message]]) -> list[tuple[StepEvent, Message]]:
        """The batch's step events, less canary steps already screened (a redelivered batch
        upstream re-injects the same canary instances)."""
        from dashboards.canary import is_canary

        events: list[tuple[StepEvent, Message]] = []
        for rec, m in items:
            if not isinstance(rec, StepEvent):  # pragma: no cover - the models map admits these
                raise TypeError(f"expected a step event, got {rec.kind}")
            if is_canary(rec.meta):
                key = f"{rec.trajectory_id}/{rec.step.step_id}"
                if key in self._canaries_seen:
                    continue
            events.append((rec, m))
        return events

    def handle_batch(self, items: list[tuple[Record, Message]]) -> list[Output]:
        from dashboards.canary import is_canary
        from monitor.screening import screen_step_of

        events = self._fresh(items)
        if not events:
            return []
        # every step's history: what is stored plus the earlier steps of this batch
        pending: dict[str, OrderedDict[str, tuple[Step, str | None]]] = {}
        steps: list[ScreenStep] = []
        for e, _ in events:
            steps.append(screen_step_of(e, self.history.before(e, pending)))
            parent = e.meta.get("parent_step_id") if e.meta else None
            pending.setdefault(e.trajectory_id, OrderedDict())[e.step.step_id] = (
                e.step, parent if isinstance(parent, str) else None
            )
        spent = dict(self.screener.timings)
        verdicts = self.screener.screen(steps, through=1)  # may raise: nothing changed yet
        now = time.time()
        canary = [is_canary(e.meta) for e, _ in events]
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
            outputs.extend(self._track_rollout(e, m, v, now))
        while len(self._canaries_seen) > 100_000:
            self._canaries_seen.popitem(last=False)
        outputs.extend(self._inject(events, canary))
        self.stats.add_tiers((v.tier for v, c in zip(verdicts, canary, strict=True) if not c))
        self.stats.add("canaries", sum(canary))
        self.stats.add("canaries_to_review",
                       sum(v.tier >= 2 for v, c in zip(verdicts, canary, strict=True) if c))
        if self.metrics is not None:
            self._observe(events, verdicts, canary, spent)
        return outputs

    def _label(self, e: StepEvent, canary: bool, now: float) -> list[Output]:
        """The step's own label (replayed benchmark data, canaries) for the recall stage."""
        if e.step.label is None:
            return []
        from dashboards.canary import canary_of

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
        from dashboards.canary import canary_events

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
        for (e, _), v, c in zip(events, verdicts, canary, strict=True):
            flag = "true" if c else "false"
            for t in range(min(v.tier, 2) + 1):
                m.steps.labels(stream=e.source, tier=str(t), canary=flag).inc()
            m.tier_latency.labels(tier="0").observe(took[0])
            if v.tier >= 1:
                m.tier_latency.labels(tier="1").observe(took[1])
            if v.tier >= 2:
                m.escalations.labels(stream=e.source, tier="2").inc()

    def _outputs(self, e: StepEvent, st: ScreenStep, v: StepVerdict, now: float) -> list[Output]:
        tid, sid = e.trajectory_id, e.step.step_id
        gates = self.screener.policy.gates
        signals = _finite(v.signals)
        l0 = {k: x for k, x in signals.items() if k not in self._l1_signals}
        out: list[Output] = []

        def emit(record: Score | Escalation) -> None:
            topic = self.topics.scores if isinstance(record, Score) else self.topics.escalations
            out.append(Output(topic, record, key=tid, idempotency_key=record.idempotency_key))

        common: dict[str, Any] = {"trajectory_id": tid, "step_id": sid, "source": e.source,
                                  "created_at": now}
        emit(Score(tier=0, score=_clip01(v.gate_scores[0]), flagged=v.tier >= 1, signals=l0,
                   **common))
        if v.tier >= 1 and len(v.gate_scores) > 1:
            emit(Score(tier=1, score=_clip01(v.gate_scores[1]), flagged=v.tier >= 2,
                       signals=signals, **common))
        if v.tier >= 2:
            p = v.gate_scores[1]
            emit(
                Escalation(
                    tier=2,
                    score=_clip01(p),
                    signals=signals,
                    reason=f"L1 gate {p:.3f} >= threshold {gates[1].threshold:.3f}",
                    trajectory=fit_trajectory(st.trajectory_so_far()),
                    **common,
                )
            )
        return out

    def _track_rollout(self, e: StepEvent, m: Message, v: StepVerdict, now: float) -> list[Output]:
        if e.source != "rollout":
            return []
        eid = str(e.meta.get("execution_id") or e.trajectory_id)
        tp = (m.topic, m.partition)
        ex = self._open.setdefault(eid, _Execution(after_timeout=eid in self._timed_out))
        ex.first[tp] = min(ex.first.get(tp, m.offset), m.offset)
        self._quiet.touch(eid, m)
        ex.score = max(ex.score, _clip01(v.score))
        if v.tier >= 2:
            ex.reasons[e.step.step_id] = (
                f"step {e.step.step_id} reached L{v.tier} (score {v.score:.3f})"
            )
        out: list[Output] = []
        if e.final:
            out.extend(self._close(eid, now, incomplete=bool(e.meta.get("incomplete"))))
        for old in self._quiet.quiet(keep={eid}):  # too many open, or gone quiet
            out.extend(self._close(old, now, timed_out=True))
        return out

    def _close(self, eid: str, now: float, *, timed_out: bool = False,
               incomplete: bool = False) -> list[Output]:
        """The verdict of execution ``eid``; it holds commits no more."""
        ex = self._open.pop(eid)
        self._quiet.forget(eid)
        partial = timed_out or incomplete or ex.after_timeout
        if timed_out:
            self._timed_out[eid] = None
            while len(self._timed_out) > 100_000:
                self._timed_out.popitem(last=False)
            if self.metrics is not None:
                self.metrics.rollout_timeouts.labels(stage="screen").inc()
        verdict = RolloutVerdict(
            execution_id=eid,
            quarantine=bool(ex.reasons),
            score=ex.score,
            reasons=list(ex.reasons.values()),
            step_ids=list(ex.reasons),
            created_at=now,
            incomplete=partial,
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


# --- the paging client ------------------------------------------------------------------


class PagingUnavailable(RetryLater):  # noqa: N818 - a RetryLater
    """The paging service did not take the page (unreachable, 5xx, auth): retry the batch."""


class PageRejected(ValueError):
    """The paging service refused this page as invalid (HTTP 400/422): a bad record."""


@dataclass(frozen=True)
class PagingClient:
    """Triggers pages through the paging service's HTTP API (``POST /api/v1/events``)."""

    url: str
    token: str
    timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5

    def trigger(self, event: Mapping[str, Any]) -> str:
        """Send one trigger event; return the service's message ("page opened", "deduplicated")."""
        import httpx

        endpoint = self.url.rstrip("/") + "/api/v1/events"
        headers = {"Authorization": f"Bearer {self.token}"}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = httpx.post(endpoint, json=dict(event), headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as e:
                last = f"cannot reach the paging service at {self.url}: {type(e).__name__}: {e}"
                continue
            if r.status_code in (200, 201, 202):
                return str(r.json().get("message", "accepted"))
            detail = _detail(r)
            if r.status_code in (400, 422):
                raise PageRejected(f"the paging service refused the page: {detail}")
            last = f"the paging service answered HTTP {r.status_code}: {detail}"
            if r.status_code in (401, 403, 404):
                break  # configuration: waiting a few seconds will not help; the batch waits
        raise PagingUnavailable(last)


def _detail(r: Any) -> str:
    try:
        return str(r.json().get("detail"))[:300]
    except ValueError:
        return str(r.text)[:300]


def page_event(
    escalation: Escalation,
    v: StepVerdict,
    thresholds: Sequence[float],
    *,
    attribution: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trigger event of a tier-3 step: dedup key ``trajectory_id/step_id`` (README);
    ``attribution``: the harm attribution of the trajectory so far, when there is one."""
    traj = escalation.trajectory
    assert traj is not None
    step = traj.steps[-1]
    a = step.action
    what = f"{a.tool.name}({', '.join(map(str, a.tool.arguments))})" if a.tool else a.text
    what = " ".join(what.split())[:160]
    signals = _finite(v.signals)
    scores = [
        {
            "tier": k,
            "score": _clip01(p),
            "threshold": float(thresholds[k]),
            "flagged": bool(v.tier > k),
            "signals": signals if k == len(v.gate_scores) - 1 else {},
        }
        for k, p in enumerate(v.gate_scores)
    ]
    details: dict[str, Any] = {
        "trajectory": traj.model_dump(mode="json"),
        "trajectory_id": traj.trajectory_id,
        "step_id": step.step_id,
        "scores": scores,
        "rubric": v.review.to_dict() if v.review is not None else None,
    }
    eid = traj.meta.get("execution_id")
    if isinstance(eid, str) and eid:
        details["execution_id"] = eid
    if attribution is not None:
        details["attribution"] = dict(attribution)
    return {
        "event_action": "trigger",
        "dedup_key": f"{traj.trajectory_id}/{step.step_id}",
        "payload": {
            "summary": f"{traj.trajectory_id} step {step.step_id}: {what} "
            f"(harm {v.score:.2f}, L3)"[:1024],
            "source": escalation.source,
            "severity": "critical",
            "custom_details": details,
        },
    }


# --- the review stage (L2, L3) ----------------------------------------------------------


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
        report: Report = _stderr,
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
        from dashboards.canary import is_canary
        from monitor.screening import ScreenStep

        todo: list[Escalation] = []
        for rec, _ in items:
            if not isinstance(rec, Escalation):  # pragma: no cover - the models map admits these
                raise TypeError(f"expected an escalation, got {rec.kind}")
            if rec.tier != 2:
                continue  # tier-3 escalations are this stage's own output
            if rec.trajectory is None or not rec.trajectory.steps:
                raise ValueError(
                    f"tier-2 escalation of {rec.trajectory_id}/{rec.step_id} carries no trajectory"
                )
            if rec.trajectory.steps[-1].step_id != rec.step_id:
                raise ValueError(
                    f"tier-2 escalation of {rec.trajectory_id}/{rec.step_id}: its trajectory "
                    f"ends at step {rec.trajectory.steps[-1].step_id!r}"
                )
            todo.append(rec)
        if not todo:
            return []
        steps = [ScreenStep.from_trajectory_so_far(e.trajectory) for e in todo]  # type: ignore[arg-type]
        spent = self.screener.timings.get("L2", 0.0)
        verdicts = self.screener.review(steps, [e.signals for e in todo])
        took = self.screener.timings.get("L2", 0.0) - spent
        thresholds = [g.threshold for g in self.screener.policy.gates]
        now = time.time()
        outputs: list[Output] = []
        pages: list[tuple[Escalation, StepVerdict]] = []
        for e, v in zip(todo, verdicts, strict=True):
            common: dict[str, Any] = {"trajectory_id": e.trajectory_id, "step_id": e.step_id,
                                      "source": e.source, "created_at": now}
            signals = _finite(v.signals)
            p = v.gate_scores[2] if len(v.gate_scores) > 2 else v.score
            score = Score(tier=2, score=_clip01(p), flagged=v.tier >= 3, signals=signals,
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
                up = Escalation(tier=3, score=_clip01(p), signals=signals,
                                reason=f"L2 gate {p:.3f} >= threshold {thresholds[2]:.3f}",
                                trajectory=e.trajectory, **common)
                outputs.append(Output(self.topics.escalations, up, key=e.trajectory_id,
                                      idempotency_key=up.idempotency_key))
                pages.append((e, v))
        if self.paging is not None:
            attributions = self._attribute([e for e, _ in pages])
            for (e, v), att in zip(pages, attributions, strict=True):
                # a PagingUnavailable leaves the batch uncommitted
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
        elif pages:
            self.report(f"{len(pages)} step(s) reached L3 but no paging service is configured")
        self.stats.add("reviewed", len(todo))
        self.stats.add("pages", len(pages))
        return outputs

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


# --- the loaders ------------------------------------------------------------------------


def load_review_screener(policy: str | Path | None = None) -> Screener:
    """The review stage's screener: the policy and the L2 reviewer, no L0/L1 models."""
    from monitor.pipeline import Screener, default_policy_path
    from monitor.tiers import CalibratedPolicy

    cal = CalibratedPolicy.load(Path(policy).expanduser() if policy else default_policy_path())
    rv = None
    if cal.config.tiers[2].signals:
        from monitor.reviewer import ReviewerConfig, build_reviewer

        rv = build_reviewer(ReviewerConfig(**dict(cal.config.reviewer)))
    return Screener(cal, l0=(), l1=(), reviewer=rv)


# --- running the stages -----------------------------------------------------------------


@dataclass(frozen=True)
class WorkerConfig:
    """What to run and where (``monitor stream`` builds one from its flags)."""

    topics: Topics = field(default_factory=Topics)
    roles: tuple[str, ...] = ROLES
    group: str = "vigil"  # consumer groups: {group}-screen, {group}-review, {group}-reassembly
    batch_size: int = 64
    idle_timeout_s: float | None = None  # stop a stage after this long without input
    stats_every_s: float = 5.0
    grace_s: float = 1.0  # TITO: wait this long after an execution's end for late calls
    recall_max_steps: int = 200_000  # the recall stage remembers this many steps' tiers
    execution_timeout_s: float = 600.0  # a rollout execution silent this long is closed
    max_open_executions: int = 10_000  # ... and the oldest beyond this many open
    watch_interval_s: float = 1.0  # ask the broker this often whether it is there

    def group_of(self, role: str) -> str:
        return f"{self.group}-{'reassembly' if role == 'reassemble' else role}"


class Worker:
    """The stages of ``config.roles``, each in its own thread with its own bus.

    ``bus_factory`` makes one bus per stage (a bus's flush covers what its own
    stage published). ``stop`` ends every stage gracefully; with an idle
    timeout a stage ends once it and every stage upstream of it are idle.
    """

    def __init__(
        self,
        config: WorkerConfig,
        bus_factory: Callable[[], Bus],
        *,
        screener: Screener | None = None,
        review_screener: Screener | None = None,
        paging: PagingClient | None = None,
        stop: threading.Event | None = None,
        report: Report = _stderr,
        on_step: Callable[[ScreenedStep], None] | None = None,
        on_tree: Callable[[TreeSummary], None] | None = None,
        metrics: WorkerMetrics | None = None,
        canaries: CanaryInjector | None = None,
    ) -> None:
        unknown = set(config.roles) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown role {sorted(unknown)[0]!r}: choose from {', '.join(ROLES)}")
        if "screen" in config.roles and screener is None:
            raise ValueError("the screen stage needs a screener")
        if "review" in config.roles and (review_screener or screener) is None:
            raise ValueError("the review stage needs a screener")
        self.config = config
        self.bus_factory = bus_factory
        self.stop = stop or threading.Event()
        self.report = report
        self.stats = WorkerStats()
        self.metrics = metrics
        self.errors: list[tuple[str, BaseException]] = []
        self.broker: BrokerState | None = None  # what the broker watch last said
        self._delivering: dict[str, str] = {}  # stage -> why its outputs wait (while they do)
        self._done: dict[str, threading.Event] = {r: threading.Event() for r in config.roles}
        self._stages: dict[str, Callable[[Bus], StreamProcessor]] = {}
        self._dead_seen: dict[str, dict[str, int]] = {}
        self.recall: RecallStage | None = None
        topics, bs = config.topics, config.batch_size
        if "reassemble" in config.roles:
            def count_tree(t: TreeSummary) -> None:
                self.stats.add("trees")
                if t.incomplete and self.metrics is not None:
                    self.metrics.rollout_timeouts.labels(stage="reassemble").inc()
                if on_tree is not None:
                    on_tree(t)

            self._stages["reassemble"] = lambda bus: reassembly_processor(
                bus, topics, config.group_of("reassemble"), grace_s=config.grace_s,
                on_tree=count_tree, open_timeout_s=config.execution_timeout_s,
                max_open=config.max_open_executions,
            )[0]
        if "screen" in config.roles:
            assert screener is not None
            screen = ScreenStage(screener, topics, stats=self.stats, report=report,
                                 on_step=on_step, metrics=metrics, canaries=canaries,
                                 execution_timeout_s=config.execution_timeout_s,
                                 max_open_executions=config.max_open_executions)
            self._stages["screen"] = lambda bus: screen.processor(
                bus, config.group_of("screen"), batch_size=bs)
        if "review" in config.roles:
            rs = review_screener or screener
            assert rs is not None
            review = ReviewStage(rs, topics, paging=paging, stats=self.stats, report=report,
                                 metrics=metrics)
            self._stages["review"] = lambda bus: review.processor(
                bus, config.group_of("review"), batch_size=max(1, min(bs, 16)))
        if "recall" in config.roles:
            from dashboards.ground_truth import LabelJoin
            from dashboards.metrics import HARM_CATEGORIES, WorkerMetrics

            if self.metrics is None:  # the counts need somewhere to go
                from prometheus_client import CollectorRegistry

                self.metrics = WorkerMetrics(CollectorRegistry())
            categories = {str(c.meta.get("category") or "none")
                          for c in (canaries.canaries if canaries is not None else ())}
            self.metrics.init_label_groups(set(HARM_CATEGORIES) | categories)
            recall = RecallStage(topics, LabelJoin(self.metrics, config.recall_max_steps),
                                 report=report)
            self.recall = recall
            self._stages["recall"] = lambda bus: recall.processor(
                bus, config.group_of("recall"))

    def _upstream_done(self, role: str) -> bool:
        up = {"reassemble": (), "screen": ("reassemble",), "review": ("reassemble", "screen"),
              "recall": ("reassemble", "screen", "review")}
        return all(self._done[r].is_set() for r in up[role] if r in self._done)

    def _run_stage(self, role: str) -> None:
        bus = self.bus_factory()
        last_line = 0.0
        try:
            proc = self._stages[role](bus)

            def on_batch(s: ProcessorStats) -> None:
                nonlocal last_line
                self.stats.sync(role, s)
                if self.metrics is not None:
                    self._observe_batch(role, proc)
                if time.monotonic() - last_line >= self.config.stats_every_s:
                    last_line = time.monotonic()
                    self.report(self.stats.line())

            proc.on_batch = on_batch
            if self.metrics is not None:
                m = self.metrics
                proc.on_lag = lambda lags: m.observe_lag(role, lags)
            proc.on_assigned = lambda: self.report(
                f"vigil stream: {role} stage joined group {proc.group_id}")
            proc.on_health = lambda ok, why: self._on_delivery(role, ok, why)
            while not self.stop.is_set():
                proc.run(stop=self.stop, idle_timeout_s=self.config.idle_timeout_s)
                self.stats.sync(role, proc.stats)
                if self.config.idle_timeout_s is None or self._upstream_done(role):
                    break
        except BaseException as e:
            self.errors.append((role, e))
            self.report(f"vigil stream: the {role} stage failed: {type(e).__name__}: {e}")
            self.stop.set()
        finally:
            self._done[role].set()
            try:
                bus.close()
            except Exception as e:  # the stage already failed or finished; say so, do not mask
                self.report(f"vigil stream: closing the {role} stage's bus failed: {e}")

    def _on_delivery(self, role: str, ok: bool, why: str) -> None:
        if ok:
            self._delivering.pop(role, None)
            self.report(f"vigil stream: the {role} stage's outputs are acknowledged again")
        else:
            self._delivering[role] = why
            self.report(f"vigil stream: the {role} stage waits for the broker: {why}")
        if self.metrics is not None:
            self.metrics.delivering.labels(stage=role).set(1 if ok else 0)
            if not ok:
                self.metrics.delivery_failures.labels(stage=role).inc()

    def _on_broker(self, state: BrokerState) -> None:
        self.broker = state
        if state.up:
            self.report(f"vigil stream: the broker is back ({state.reason}); the stages resume")
        else:
            self.report(f"vigil stream: ALERT the broker does not answer ({state.reason}); "
                        "outputs wait and nothing is committed until it is back")
        if self.metrics is not None:
            self.metrics.broker_up.set(1 if state.up else 0)
            if not state.up:
                self.metrics.broker_outages.inc()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the worker can do its work now, and why not (``/healthz``)."""
        problems: list[str] = []
        b = self.broker
        if b is not None and not b.up:
            problems.append(f"broker down for {time.monotonic() - b.since:.0f} s: {b.reason}")
        problems.extend(f"{role}: {why}" for role, why in list(self._delivering.items()))
        problems.extend(f"{role} stage failed: {type(e).__name__}: {e}"
                        for role, e in list(self.errors))
        stages = {r: ("stopped" if self._done[r].is_set() else "running") for r in self._done}
        return not problems, {"problems": problems, "stages": stages,
                              "broker": "unknown" if b is None else ("up" if b.up else "down")}

    def _observe_batch(self, role: str, proc: StreamProcessor) -> None:
        """Dead letters since the last batch, and each input's produce-to-published time."""
        m = self.metrics
        assert m is not None
        seen = self._dead_seen.setdefault(role, {})
        for reason, n in list(proc.stats.reasons.items()):
            if n > seen.get(reason, 0):
                m.deadletters.labels(stage=role, reason=reason).inc(n - seen.get(reason, 0))
                seen[reason] = n
        now_ms = time.time() * 1000
        hist = m.step_latency.labels(stage=role)
        for msg in proc.last_batch:
            if msg.timestamp_ms > 0:
                hist.observe(max(0.0, now_ms - msg.timestamp_ms) / 1000)

    def run(self) -> int:
        """Run every stage until stopped (or idle); 0 if all ended cleanly, 1 otherwise."""
        bus = self.bus_factory()
        try:
            bus.ensure_topics(self.config.topics.all())
        finally:
            bus.close()
        from streams.health import BrokerWatch

        watch_bus = self.bus_factory()
        watch_stop = threading.Event()
        watch = BrokerWatch(watch_bus, self.config.topics.all(),
                            interval_s=self.config.watch_interval_s, on_change=self._on_broker)
        self.broker = watch.state
        watcher = watch.start(watch_stop)
        threads = [
            threading.Thread(target=self._run_stage, args=(role,), name=f"vigil-{role}",
                             daemon=True)
            for role in self.config.roles
        ]
        for t in threads:
            t.start()
        self.report(
            "vigil stream: running " + ", ".join(
                f"{r} (group {self.config.group_of(r)})" for r in self.config.roles)
        )
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        finally:
            watch_stop.set()
            watcher.join(10)
            try:
                watch_bus.close()
            except Exception as e:  # noqa: BLE001 - only the watch used it
                self.report(f"vigil stream: closing the broker watch's bus failed: {e}")
        self.report(self.stats.line())
        return 1 if self.errors else 0
