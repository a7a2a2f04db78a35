"""Prometheus metrics of the worker, the recall join and the paging service.

Every metric lives in the registry it is given (tests pass a fresh
``CollectorRegistry()``); nothing registers at import. The names are the
contract the dashboards (``dashboards.boards``), ``monitor report`` and
``docs/dashboards.md`` rely on:

worker (``monitor stream --metrics-port``)
    vigil_steps_total{stream, tier, canary}         steps that reached tier 0..3
    vigil_escalations_total{stream, tier}           escalation records published (tier 2, 3)
    vigil_tier_latency_seconds{tier}                per step: its batch's model time at L0, L1, L2
    vigil_step_latency_seconds{stage}               per step: produce time to output published
    vigil_score_latency_seconds{tier}               per step: the step's produce time to its
                                                    tier-0 (screen) or tier-1 (probe) score
    vigil_reviews_total{backend, outcome}           L2 reviews (outcome: ok | error)
    vigil_reviewer_cost_total{backend}              the reviewer's cost (its backend's unit)
    vigil_deadletters_total{stage, reason}          records sent to the dead-letter topic
    vigil_consumer_lag{stage, topic, partition}     records behind the high-water mark
    vigil_gate_budget{gate}                         share of all steps a gate may pass on
    vigil_gate_threshold{gate, kind}                calibrated and live (--adapt) thresholds, and
                                                    the ceiling the canaries' recall floor puts
                                                    on the live one (NaN before 50 canaries);
                                                    gate="trajectory": the rollout verdicts'
                                                    trajectory threshold
    vigil_rollout_verdicts_total{quarantine}        per-execution verdicts for trainers
    vigil_pages_triggered_total{result}             trigger events sent (opened | deduplicated)
    vigil_canaries_injected_total{stream}           canary steps injected into a live stream
    vigil_canaries_suppressed_total{what}           canary outputs held back (verdict | page)
    vigil_broker_up                                 1 while the broker answers, 0 while not
    vigil_broker_outages_total                      times the broker stopped answering
    vigil_stage_delivering{stage}                   1 while the broker acknowledges the stage's
                                                    outputs, 0 while they wait
    vigil_delivery_failures_total{stage}            flushes not acknowledged (then retried)
    vigil_rollout_timeouts_total{stage}             executions closed without their end
    vigil_labelled_steps_total{origin, stream, category, label, tier}
        labelled steps (label 0/1) that reached ``tier``; tier="0" counts every labelled
        step screened, so recall at tier k = reached{tier=k,label=1} / reached{tier=0,label=1}
        (``origin``: human | dataset | canary | reviewer)

paging service (``GET /metrics``)
    vigil_pages{state}                              pages by status now
    vigil_pages_opened_total                        pages ever opened
    vigil_page_verdicts_total{verdict}              human verdicts on pages (harmful | benign)
    vigil_webhook_deliveries_total{ok}              webhook delivery attempts

RL health (``monitor rlhealth``): the ``vigil_rl_*`` metrics of ``monitor.rlhealth.metrics``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


def finite(x: float) -> float:
    """``x``, or NaN where it is infinite (a gauge panel's scale ignores NaN, not +Inf)."""
    return x if math.isfinite(x) else math.nan

STREAMS = ("rollout", "deployment", "benchmark")
TIERS = (0, 1, 2, 3)
ORIGINS = ("human", "dataset", "canary", "reviewer")
# The harm categories of the AgentDojo builder
# (``worldmodel.datasets.agentdojo.trajectories.category_of``) and "none" (an unlabelled
# category): the label groups made up front (``init_label_groups``).
HARM_CATEGORIES = ("financial", "data_exfiltration", "prompt_injection", "none")

# L0 is milliseconds a batch, L2 seconds to minutes: one bucket set covers both.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60, 120, 300)


class WorkerMetrics:
    """The worker's metrics (screen, review and recall stages), in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.steps = Counter("vigil_steps", "Steps that reached a tier (tier 0: every step "
                             "screened)", ["stream", "tier", "canary"], registry=r)
        self.escalations = Counter("vigil_escalations", "Escalation records published, by the "
                                   "tier escalated to", ["stream", "tier"], registry=r)
        self.tier_latency = Histogram(
            "vigil_tier_latency_seconds",
            "Per step, the model time of the batch it was scored in, per tier",
            ["tier"], buckets=_LATENCY_BUCKETS, registry=r)
        self.step_latency = Histogram(
            "vigil_step_latency_seconds",
            "Per step, from the input record's produce time to the stage's outputs published",
            ["stage"], buckets=_LATENCY_BUCKETS, registry=r)
        self.score_latency = Histogram(
            "vigil_score_latency_seconds",
            "Per step, from the step's produce time to its tier-0 or tier-1 score computed",
            ["tier"], buckets=_LATENCY_BUCKETS, registry=r)
        self.reviews = Counter("vigil_reviews", "L2 reviews", ["backend", "outcome"], registry=r)
        self.reviewer_cost = Counter("vigil_reviewer_cost", "Reviewer cost in its backend's "
                                     "unit (endpoint: money; local: seconds)", ["backend"],
                                     registry=r)
        self.deadletters = Counter("vigil_deadletters", "Records sent to the dead-letter topic",
                                   ["stage", "reason"], registry=r)
        self.lag = Gauge("vigil_consumer_lag", "Records behind the high-water mark, per "
                         "partition of a stage's input", ["stage", "topic", "partition"],
                         registry=r)
        self.gate_budget = Gauge("vigil_gate_budget", "Share of all screened steps the gate "
                                 "out of a tier may pass on (the next tier's budget)", ["gate"],
                                 registry=r)
        self.gate_threshold = Gauge("vigil_gate_threshold", "A gate's threshold: calibrated, "
                                    "and live where the stage adapts it (--adapt), with the "
                                    "ceiling the canaries' recall floor puts on it",
                                    ["gate", "kind"], registry=r)
        self.verdicts = Counter("vigil_rollout_verdicts", "Per-execution rollout verdicts",
                                ["quarantine"], registry=r)
        self.pages = Counter("vigil_pages_triggered", "Page trigger events sent to the paging "
                             "service", ["result"], registry=r)
        self.canaries = Counter("vigil_canaries_injected", "Canary steps injected into a live "
                                "stream", ["stream"], registry=r)
        self.canaries_suppressed = Counter(
            "vigil_canaries_suppressed",
            "Canary outputs held back from trainers and humans", ["what"], registry=r)
        self.broker_up = Gauge("vigil_broker_up", "1 while the broker answers metadata "
                               "requests, 0 while it does not", registry=r)
        self.broker_outages = Counter("vigil_broker_outages", "Times the broker stopped "
                                      "answering", registry=r)
        self.delivering = Gauge("vigil_stage_delivering", "1 while the broker acknowledges the "
                                "stage's outputs, 0 while they wait", ["stage"], registry=r)
        self.delivery_failures = Counter("vigil_delivery_failures", "Flushes the broker did "
                                         "not acknowledge (retried)", ["stage"], registry=r)
        self.rollout_timeouts = Counter("vigil_rollout_timeouts", "Rollout executions closed "
                                        "without their end (incomplete)", ["stage"], registry=r)
        self.labelled = Counter(
            "vigil_labelled_steps",
            "Labelled steps that reached a tier (tier 0: every labelled step screened)",
            ["origin", "stream", "category", "label", "tier"], registry=r)
        # series that exist from the start, so dashboards show 0, not "no data"
        for stream in STREAMS:
            for tier in TIERS:
                self.steps.labels(stream=stream, tier=str(tier), canary="false")
        for tier in (0, 1, 2):
            self.tier_latency.labels(tier=str(tier))
        for tier in (0, 1):
            self.score_latency.labels(tier=str(tier))
        for flag in ("true", "false"):
            self.verdicts.labels(quarantine=flag)
        for stream in STREAMS:
            for tier in (2, 3):
                self.escalations.labels(stream=stream, tier=str(tier))
        self.broker_up.set(1)
        for stage in ("reassemble", "screen", "probe", "review", "recall"):
            self.step_latency.labels(stage=stage)
            self.delivery_failures.labels(stage=stage)
            self.delivering.labels(stage=stage).set(1)
        for stage in ("reassemble", "probe"):
            self.rollout_timeouts.labels(stage=stage)
        for result in ("opened", "deduplicated"):
            self.pages.labels(result=result)
        for stream in ("rollout", "deployment"):
            self.canaries.labels(stream=stream)
        for what in ("verdict", "page"):
            self.canaries_suppressed.labels(what=what)

    def init_label_groups(self, categories: Iterable[str] = HARM_CATEGORIES,
                          origins: Iterable[str] = ("dataset", "canary", "human"),
                          streams: Iterable[str] = STREAMS) -> None:
        """Zero series for the label groups to expect. Prometheus' ``increase()`` does not
        count a series' first scraped value, so a group whose series first appear with
        counts already in them would lose those counts from every recall window; made at
        start-up, they are scraped at zero first. (A group not made here, e.g. a category a
        human reviewer invents, loses the counts of its first scrape interval.)"""
        cats = sorted(set(categories) | {"none"})
        for origin in origins:
            for stream in streams:
                for tier in TIERS:
                    self.labelled.labels(origin=origin, stream=stream, category="none",
                                         label="0", tier=str(tier))
                    for cat in cats:
                        self.labelled.labels(origin=origin, stream=stream, category=cat,
                                             label="1", tier=str(tier))

    def init_reviewer(self, backend: str) -> None:
        """Zero series for a review stage's reviewer (``none`` when it has none)."""
        for outcome in ("ok", "error"):
            self.reviews.labels(backend=backend, outcome=outcome)
        self.reviewer_cost.labels(backend=backend)

    def observe_lag(self, stage: str, lags: Mapping[tuple[str, int], int]) -> None:
        for (topic, partition), n in lags.items():
            self.lag.labels(stage=stage, topic=topic, partition=str(partition)).set(n)
