"""The RL-health stream: TITO topics → execution trees → rolling signals, alerts, metrics.

    consume (calls, execution ends) → assemble trees → per-execution signals →
    close versions → alerts → publish one L0 ``Score`` per execution → metrics

:class:`RLHealthMonitor` is the pure state machine (trees in, signals and alerts
out) that both the offline report (``monitor rlhealth --file``) and the stream
use; :class:`RLHealthStream` is the handler, tick and hold of a
:class:`~streams.processor.StreamProcessor` over the TITO topics. Inputs of
executions still open are never committed, so a crash replays them; a record
that cannot be decoded, conflicts with an earlier delivery, or arrives after
its execution was emitted is dead-lettered.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor.rlhealth.alerts import (
    Alert,
    AlertConfig,
    AlertLatch,
    alert_outputs,
    condition_key,
    drift_alert,
    mismatch_alert,
    mismatch_reference,
    reward_hacking_alert,
    staleness_alert,
)
from monitor.rlhealth.art import ArtMonitor
from monitor.rlhealth.art_stream import ArtStream
from monitor.rlhealth.formulas import relative_extra_discrepancy
from monitor.rlhealth.metrics import RLHealthMetrics
from monitor.rlhealth.signals import (
    CallSignals,
    ExecutionSignals,
    GroupSignals,
    VersionSignals,
    as_dict,
    execution_signals,
    group_signals,
    version_signals,
)
from streams.bus import Bus, Message
from streams.config import Topics
from streams.media import ArtIteration, MediaRollout
from streams.processor import Output, Positions, StreamProcessor
from streams.records import ExecutionEnd, Record, Score, TitoCall
from streams.rollouts import TreeCollector
from streams.tito import ExecutionTree, TreeAssembler

HarmFn = Callable[[ExecutionTree], float | None]


@dataclass(frozen=True)
class RLHealthConfig:
    """What the run is configured to do (φ, μ, J_max, δ) and the alert bounds."""

    j_max: int = 5
    trust_delta: float = 0.8
    alerts: AlertConfig = field(default_factory=AlertConfig)
    durations_kept: int = 10_000  # recent durations for the long-tail quantiles
    # A training version is closed (judged) once a version close_lag above it has been
    # seen, or once nothing arrived for it for close_after_s while a later one exists.
    # A file in order: lag 1. A stream (partitions interleave versions): by time.
    close_lag: int | None = 1
    close_after_s: float | None = None


def _quantiles(xs: Iterable[float]) -> dict[str, float] | None:
    a = np.fromiter(xs, dtype=np.float64)
    if a.size == 0:
        return None
    q = np.quantile(a, [0.5, 0.9, 0.99])
    return {
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "tail_ratio_p99_p50": float(q[2] / q[0]) if q[0] > 0 else float("inf"),
    }


class RLHealthMonitor:
    """Rolling RL-health statistics over a stream of ended executions.

    A training version is *closed* once it is done (``RLHealthConfig.close_lag``
    versions behind the newest, or idle for ``close_after_s``; all at
    :meth:`finish`); version-level alerts are judged on closed versions only, so
    a partly seen version never raises one, and a sample arriving for a closed
    version is counted in ``late_samples`` and the shape but not re-judged.
    Groups (query × consumed version) close with their version.
    """

    def __init__(
        self,
        config: RLHealthConfig | None = None,
        metrics: RLHealthMetrics | None = None,
        harm_fn: HarmFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RLHealthConfig()
        self.clock = clock
        self.metrics = metrics
        self.harm_fn = harm_fn
        self.executions = 0
        self.closed: list[VersionSignals] = []  # by trainer (consumed) version
        self.closed_policy: list[VersionSignals] = []  # mismatch, by rollout version
        self.flagged_groups: list[GroupSignals] = []
        self.groups_seen = 0
        self._exec_by_version: dict[int, list[ExecutionSignals]] = defaultdict(list)
        self._calls_by_trainer: dict[int, list[CallSignals]] = defaultdict(list)
        self._calls_by_policy: dict[int, list[CallSignals]] = defaultdict(list)
        self._groups_prev: dict[str, GroupSignals] = {}
        self._max_trainer: int | None = None
        self._max_policy: int | None = None
        self._closed_trainer: int | None = None  # every version <= this is judged
        self._closed_policy: int | None = None
        self._arrival_trainer: dict[int, float] = {}
        self._arrival_policy: dict[int, float] = {}
        self.late_samples = 0
        self._durations: deque[float] = deque(maxlen=self.config.durations_kept)
        self._timeout_rewards: deque[float] = deque(maxlen=self.config.durations_kept)
        self._totals: dict[str, int] = defaultdict(int)
        self._admitted_roles: dict[str, int] = defaultdict(int)
        # alerts fire when a condition starts, not every version
        self.latch = AlertLatch(metrics.observe_alert if metrics is not None else None)
        self.alerts = self.latch.raised
        self._drift_by_pass: dict[int, dict[int, list[float]]] = {}
        if metrics is not None:
            metrics.staleness_expected.set(self.config.alerts.expected_staleness)

    # -- input ------------------------------------------------------------------

    def observe(
        self, tree: ExecutionTree, now: float | None = None
    ) -> tuple[ExecutionSignals, list[Alert]]:
        """Take one ended execution; returns its signals and the alerts it closed."""
        now = self.clock() if now is None else now
        harm = self.harm_fn(tree) if self.harm_fn is not None else None
        ex = execution_signals(
            tree, j_max=self.config.j_max, delta=self.config.trust_delta, harm=harm
        )
        pass_key = ex.consumed_version if ex.consumed_version is not None else -1
        drift = self._drift_by_pass.setdefault(pass_key, {}).setdefault(ex.reuse_pass, [0.0, 0])
        for c in ex.call_signals:
            drift[0] += abs(c.drift_nats)
            drift[1] += 1
        if ex.reuse_pass > 0:
            # a re-scored replica of an execution (multi-pass reuse): drift only
            if self.metrics is not None:
                for c in ex.call_signals:
                    self.metrics.drift.observe(abs(c.drift_nats))
            self._add_trainer(ex, now)
            return ex, self.tick(now)
        self.executions += 1
        t = self._totals
        t["calls"] += ex.calls
        t["leaves"] += ex.leaves
        t["admitted"] += ex.admitted
        t["dropped"] += ex.dropped
        t["node_occurrences"] += ex.node_occurrences
        t["unique_nodes"] += ex.unique_nodes
        t["timed_out"] += ex.timed_out
        for role in ex.admitted_roles:
            self._admitted_roles[role] += 1
        self._durations.append(ex.duration_s)
        if ex.timed_out and ex.reward is not None:
            self._timeout_rewards.append(ex.reward)
        if self.metrics is not None:
            self.metrics.observe_execution(ex)

        for c in ex.call_signals:
            if c.policy_version is not None:
                self._add_policy(c.policy_version, c, now)
        self._add_trainer(ex, now)
        return ex, self.tick(now)

    def _add_trainer(self, ex: ExecutionSignals, now: float) -> None:
        calls = ex.call_signals
        versions = {c.trainer_version for c in calls if c.trainer_version is not None}
        if ex.consumed_version is not None:
            versions.add(ex.consumed_version)
        late = self._closed_trainer is not None and any(v <= self._closed_trainer for v in versions)
        if late:  # its version was judged already: counted in the shape, not the version
            self.late_samples += 1
            return
        if ex.consumed_version is not None and ex.reuse_pass == 0:
            self._exec_by_version[ex.consumed_version].append(ex)
        for c in calls:
            if c.trainer_version is not None:
                self._calls_by_trainer[c.trainer_version].append(c)
        for v in versions:
            self._arrival_trainer[v] = now
            if self._max_trainer is None or v > self._max_trainer:
                self._max_trainer = v

    def _add_policy(self, version: int, call: CallSignals, now: float) -> None:
        if self._closed_policy is not None and version <= self._closed_policy:
            return
        self._calls_by_policy[version].append(call)
        self._arrival_policy[version] = now
        if self._max_policy is None or version > self._max_policy:
            self._max_policy = version

    def _closable(
        self,
        open_versions: Iterable[int],
        newest: int | None,
        arrival: dict[int, float],
        now: float,
    ) -> list[int]:
        """Open versions below the newest that are done: ``close_lag`` versions behind
        it, or idle for ``close_after_s``; in order, stopping at the first still open."""
        cfg = self.config
        out = []
        for v in sorted(open_versions):
            if newest is None or v >= newest:
                break
            by_lag = cfg.close_lag is not None and newest >= v + cfg.close_lag
            by_time = cfg.close_after_s is not None and now - arrival[v] >= cfg.close_after_s
            if not (by_lag or by_time):
                break
            out.append(v)
        return out

    def tick(self, now: float | None = None) -> list[Alert]:
        """Close the versions that are done (see ``RLHealthConfig.close_lag``) and judge them."""
        now = self.clock() if now is None else now
        open_trainer = set(self._exec_by_version) | set(self._calls_by_trainer)
        out = self._close_trainer(
            self._closable(open_trainer, self._max_trainer, self._arrival_trainer, now)
        )
        out += self._close_policy(
            self._closable(self._calls_by_policy, self._max_policy, self._arrival_policy, now)
        )
        return out

    def finish(self) -> list[Alert]:
        """Close every open version (end of a file, or shutdown)."""
        out = self._close_trainer(sorted(set(self._exec_by_version) | set(self._calls_by_trainer)))
        out += self._close_policy(sorted(self._calls_by_policy))
        return out

    # -- closing versions ---------------------------------------------------------

    def _raise(self, condition: str, alert: Alert | None, into: list[Alert]) -> None:
        """Judge ``condition`` (``alert`` if it holds, else None); raise only on its rising
        edge: a condition that stays in the alert state over many versions is one alert."""
        if (raised := self.latch.judge(condition, alert)) is not None:
            into.append(raised)

    def _close_trainer(self, versions: list[int]) -> list[Alert]:
        out: list[Alert] = []
        cfg = self.config.alerts
        for v in versions:
            self._closed_trainer = v
            self._arrival_trainer.pop(v, None)
            executions = self._exec_by_version.pop(v, [])
            vs = version_signals(v, executions, self._calls_by_trainer.pop(v, []))
            self.closed.append(vs)
            if self.metrics is not None:
                self.metrics.set_version(vs, cfg.expected_staleness)
            self._raise(condition_key("staleness"), staleness_alert(self.closed, cfg), out)
            self._raise(condition_key("drift"), drift_alert(self.closed, cfg), out)
            out += self._close_groups(executions)
        return out

    def _close_groups(self, executions: list[ExecutionSignals]) -> list[Alert]:
        out: list[Alert] = []
        by_query: dict[str, list[ExecutionSignals]] = defaultdict(list)
        for e in executions:
            by_query[e.query_id].append(e)
        for qid in sorted(by_query):
            g = group_signals(by_query[qid], previous=self._groups_prev.get(qid))
            self._groups_prev[qid] = g
            self.groups_seen += 1
            if self.metrics is not None:
                self.metrics.observe_group(g)
            if g.reward_hacking:
                self.flagged_groups.append(g)
            self._raise(condition_key("reward_hacking", qid), reward_hacking_alert(g), out)
        return out

    def _close_policy(self, versions: list[int]) -> list[Alert]:
        out: list[Alert] = []
        cfg = self.config.alerts
        for v in versions:
            self._closed_policy = v
            self._arrival_policy.pop(v, None)
            vs = version_signals(v, [], self._calls_by_policy.pop(v))
            self.closed_policy.append(vs)
            ref = mismatch_reference(self.closed_policy, cfg)
            if self.metrics is not None:
                extra = (
                    relative_extra_discrepancy(vs.mismatch_abs_mean, ref)
                    if ref is not None and vs.mismatch_abs_mean is not None
                    else None
                )
                self.metrics.set_mismatch(vs, extra)
            self._raise(condition_key("mismatch"), mismatch_alert(self.closed_policy, cfg), out)
        return out

    # -- report -------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Everything seen so far, JSON-ready (what ``monitor rlhealth --file`` prints)."""
        cfg = self.config
        t = dict(self._totals)
        stale_n = sum(sum(v.staleness_hist.values()) for v in self.closed)
        stale_sum = sum(d * c for v in self.closed for d, c in v.staleness_hist.items())
        hist: dict[int, int] = defaultdict(int)
        for v in self.closed:
            for d, c in v.staleness_hist.items():
                hist[d] += c
        warm = [v for v in self.closed if v.version >= cfg.alerts.warmup]
        warm_n = sum(sum(v.staleness_hist.values()) for v in warm)
        warm_sum = sum(d * c for v in warm for d, c in v.staleness_hist.items())
        occ = t.get("node_occurrences", 0)
        ref = mismatch_reference(self.closed_policy, cfg.alerts)
        return {
            "config": {
                "phi": cfg.alerts.phi,
                "mu": cfg.alerts.mu,
                "j_max": cfg.j_max,
                "trust_delta": cfg.trust_delta,
            },
            "executions": self.executions,
            "late_samples": self.late_samples,
            "staleness": {
                "expected": cfg.alerts.expected_staleness,
                "observed_mean": stale_sum / stale_n if stale_n else None,
                "observed_mean_after_warmup": warm_sum / warm_n if warm_n else None,
                "warmup_versions": cfg.alerts.warmup,
                "histogram": dict(sorted(hist.items())),
            },
            "shape": {
                "duration_s": _quantiles(self._durations),
                "timed_out": t.get("timed_out", 0),
                "timeout_reward": _quantiles(self._timeout_rewards),
                "calls": t.get("calls", 0),
                "leaves": t.get("leaves", 0),
                "admitted": t.get("admitted", 0),
                "admitted_by_role": dict(sorted(self._admitted_roles.items())),
                "dropped_over_j_max": t.get("dropped", 0),
                "node_occurrences": occ,
                "unique_nodes": t.get("unique_nodes", 0),
                "dedup_ratio": t.get("unique_nodes", 0) / occ if occ else None,
            },
            "versions": [as_dict(v) for v in self.closed],
            "drift_by_pass": {
                v: {p: s / n for p, (s, n) in sorted(by.items()) if n}
                for v, by in sorted(self._drift_by_pass.items())
            },
            "mismatch": {
                "reference": ref,
                "by_policy_version": [as_dict(v) for v in self.closed_policy],
            },
            "groups": {
                "seen": self.groups_seen,
                "flagged": [as_dict(g) for g in self.flagged_groups],
            },
            "alerts": [as_dict(a) for a in self.alerts],
            "alerts_active": [as_dict(a) for a in self.latch.active],
        }


def score_for(ex: ExecutionSignals) -> Score:
    """The execution's RL-health record: its ``rl_*`` aggregates, and as ``score`` the larger
    of the two per-step L0 flags over the whole execution (:mod:`monitor.scorers.rlhealth`):
    1 if it timed out, else the token-weighted share of tokens out of the trust region."""
    signals: dict[str, float] = {
        "rl_duration_s": ex.duration_s,
        "rl_timed_out": float(ex.timed_out),
        "rl_admitted": float(ex.admitted),
        "rl_dedup_ratio": ex.dedup_ratio,
    }
    if ex.staleness is not None:
        signals["rl_staleness"] = float(ex.staleness)
    if ex.reward is not None:
        signals["rl_reward"] = float(ex.reward)
    if ex.harm is not None:
        signals["rl_harm"] = float(ex.harm)
    if ex.call_signals:
        cs = ex.call_signals
        tokens = sum(c.tokens for c in cs) or 1
        signals["rl_drift_abs_nats_max"] = max(abs(c.drift_nats) for c in cs)
        signals["rl_out_of_trust_share"] = sum(c.out_of_trust_share * c.tokens for c in cs) / tokens
        signals["rl_mismatch_abs_mean"] = sum(c.mismatch_abs_mean * c.tokens for c in cs) / tokens
        signals["rl_k3_kl_max"] = max(c.k3_kl for c in cs)
    return Score(
        trajectory_id=ex.execution_id,
        step_id="rlhealth",
        tier=0,
        score=max(signals["rl_timed_out"], signals.get("rl_out_of_trust_share", 0.0)),
        signals=signals,
        source="rollout",
        created_at=time.time(),
    )


@dataclass
class RLHealthStream:
    """The handler, tick and hold of a ``StreamProcessor`` over the TITO topics."""

    topics: Topics
    monitor: RLHealthMonitor
    grace_s: float = 1.0
    publish_scores: bool = True
    art: ArtStream | None = None  # image / video generation rollouts (ART), when consumed
    collector: TreeCollector = field(init=False)

    def __post_init__(self) -> None:
        self.collector = TreeCollector(grace_s=self.grace_s)

    def handle(self, record: Record, message: Message) -> Iterable[Output]:
        if isinstance(record, MediaRollout | ArtIteration):
            assert self.art is not None  # the processor reads the ART topics only with one
            return self.art.handle(record, message)
        self.collector.handle(record, message)
        return ()

    def tick(self) -> list[Output]:
        art = self.art.tick() if self.art is not None else []
        return self._observe(self.collector.ready()) + self._alerts(self.monitor.tick()) + art

    def flush(self) -> list[Output]:
        """Emit everything buffered, ended or not, and close every version."""
        art = self.art.flush() if self.art is not None else []
        return self._observe(self.collector.flush()) + self._alerts(self.monitor.finish()) + art

    def hold(self) -> Positions:
        held = dict(self.collector.hold())
        for tp, off in (self.art.hold() if self.art is not None else {}).items():
            held[tp] = min(held.get(tp, off), off)
        return held

    def _observe(self, trees: list[ExecutionTree]) -> list[Output]:
        outputs: list[Output] = []
        for tree in trees:
            ex, alerts = self.monitor.observe(tree)
            if self.publish_scores and ex.reuse_pass == 0:
                score = score_for(ex)
                outputs.append(
                    Output(
                        self.topics.scores,
                        score,
                        key=tree.execution_id,
                        idempotency_key=score.idempotency_key,
                    )
                )
            outputs += self._alerts(alerts)
        return outputs

    def _alerts(self, alerts: list[Alert]) -> list[Output]:
        return alert_outputs(self.topics.scores, alerts) if self.publish_scores else []


def rlhealth_processor(
    bus: Bus,
    topics: Topics,
    monitor: RLHealthMonitor,
    group_id: str = "vigil-rlhealth",
    *,
    grace_s: float = 1.0,
    publish_scores: bool = True,
    max_record_bytes: int = 8 * 1_048_576,
    art: ArtMonitor | None = None,
    art_steps: bool = True,
) -> tuple[StreamProcessor, RLHealthStream]:
    """A processor over the TITO topics feeding ``monitor`` (and, with ``art``, the ART
    topics feeding it; ``art_steps``: every endpoint also goes to the rollout steps topic
    for the tiers); bad records are dead-lettered."""
    art_stream = (
        ArtStream(topics, art, publish_scores=publish_scores, publish_steps=art_steps)
        if art is not None
        else None
    )
    s = RLHealthStream(
        topics, monitor, grace_s=grace_s, publish_scores=publish_scores, art=art_stream
    )
    models: dict[str, type[Record]] = {
        topics.tito_calls: TitoCall,
        topics.tito_executions: ExecutionEnd,
    }
    if art is not None:
        models |= {topics.art_rollouts: MediaRollout, topics.art_iterations: ArtIteration}
    proc = StreamProcessor(
        bus,
        models,
        group_id,
        s.handle,
        deadletter_topic=topics.deadletter,
        max_record_bytes=max_record_bytes,
        tick=s.tick,
        hold=s.hold,
    )
    return proc, s


def monitor_records(
    records: Iterable[Record], monitor: RLHealthMonitor, art: ArtMonitor | None = None
) -> tuple[RLHealthMonitor, dict[str, int]]:
    """Offline: feed a file's TITO records through ``monitor`` in file order (and its ART
    records through ``art``, when given).

    An execution is observed when its end record arrives (a call after its
    end is late, as in the stream); what never ended is observed at the end.
    Returns the monitor and the admission counts.
    """
    asm = TreeAssembler()
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        if isinstance(r, TitoCall):
            counts[asm.add_call(r)] += 1
        elif isinstance(r, ExecutionEnd):
            counts[asm.add_end(r)] += 1
            for tree in asm.pop_completed([r.execution_id]):
                monitor.observe(tree)
        elif art is not None and isinstance(r, MediaRollout | ArtIteration):
            counts[r.kind] += 1
            art.observe(r)
        else:
            counts["skipped"] += 1
    for tree in asm.flush():
        monitor.observe(tree)
    monitor.finish()
    if art is not None:
        art.finish()
    return monitor, dict(counts)
