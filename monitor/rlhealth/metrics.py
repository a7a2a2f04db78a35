"""Prometheus metrics of the RL-health stream; every metric lives in the given registry.

    registry = CollectorRegistry()
    metrics = RLHealthMetrics(registry)
    metrics.observe_execution(signals)       # per execution
    metrics.set_version(version_signals)     # when a training version closes

Names follow ``vigil_rl_*``; histograms and counters are per execution or per
sequence, gauges hold the latest closed version.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from monitor.rlhealth.alerts import ALERT_KINDS, Alert
from monitor.rlhealth.signals import (
    ArtVersionSignals,
    ExecutionSignals,
    GroupSignals,
    VersionSignals,
)

_STALENESS_BUCKETS = (0, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16)
_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
_NATS_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300)
_UNIT_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class RLHealthMetrics:
    """The ``vigil_rl_*`` metrics, registered in ``registry`` (tests pass a fresh one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.executions = Counter(
            "vigil_rl_executions", "Ended executions seen", ["timed_out"], registry=r
        )
        self.staleness = Histogram(
            "vigil_rl_staleness",
            "Per consumed sample d = consumed_version - dispatch_version",
            buckets=_STALENESS_BUCKETS,
            registry=r,
        )
        self.staleness_mean = Gauge(
            "vigil_rl_staleness_mean", "Mean staleness of the latest closed version", registry=r
        )
        self.staleness_expected = Gauge(
            "vigil_rl_staleness_expected", "Configured E[d] = phi + (mu - 1)/2", registry=r
        )
        self.duration = Histogram(
            "vigil_rl_execution_duration_seconds",
            "Execution wall time, first call start to end",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.timeout_reward = Histogram(
            "vigil_rl_timeout_reward",
            "Partial-progress reward of timed-out executions",
            buckets=_UNIT_BUCKETS,
            registry=r,
        )
        self.admitted = Counter(
            "vigil_rl_trajectories_admitted",
            "Trajectories admitted under J_max, by leaf role",
            ["role"],
            registry=r,
        )
        self.dropped = Counter(
            "vigil_rl_trajectories_dropped", "Trajectories over the J_max cap", registry=r
        )
        self.node_occurrences = Counter(
            "vigil_rl_node_occurrences",
            "Calls counted once per trajectory through them",
            registry=r,
        )
        self.unique_nodes = Counter(
            "vigil_rl_unique_nodes", "Calls counted once (shared-prefix de-duplicated)", registry=r
        )
        self.dedup_ratio = Histogram(
            "vigil_rl_dedup_ratio",
            "Per execution unique nodes / node occurrences",
            buckets=_UNIT_BUCKETS,
            registry=r,
        )
        self.drift = Histogram(
            "vigil_rl_drift_abs_nats",
            "Per sequence |M|, M = sum(log p_train - log p_rollout)",
            buckets=_NATS_BUCKETS,
            registry=r,
        )
        self.drift_nats = Gauge(
            "vigil_rl_drift_nats", "Mean |M| of the latest closed training version", registry=r
        )
        self.out_of_trust = Gauge(
            "vigil_rl_out_of_trust_share",
            "Token share with |rho - 1| > delta, latest closed version",
            registry=r,
        )
        self.log_turn_ratio = Histogram(
            "vigil_rl_log_turn_ratio_abs",
            "Per assistant turn |log rho_t|, rho_t = prod rho_t,i",
            buckets=_NATS_BUCKETS,
            registry=r,
        )
        self.mismatch = Gauge(
            "vigil_rl_mismatch_abs_logprob",
            "Mean per-token |log p_train - log p_rollout|, latest closed rollout version",
            registry=r,
        )
        self.mismatch_k3 = Gauge(
            "vigil_rl_mismatch_k3_kl", "Mean per-sequence k3 KL, latest closed version", registry=r
        )
        self.mismatch_relative = Gauge(
            "vigil_rl_mismatch_relative_extra",
            "(D - D_ref)/D_ref, latest closed version",
            registry=r,
        )
        self.version = Gauge(
            "vigil_rl_training_version", "Latest closed training version", registry=r
        )
        self.group_reward = Histogram(
            "vigil_rl_group_reward_mean",
            "Mean reward per execution group",
            buckets=_UNIT_BUCKETS,
            registry=r,
        )
        self.reward_hacking = Counter(
            "vigil_rl_reward_hacking_groups",
            "Groups flagged: reward and harm rise together",
            registry=r,
        )
        self._art_metrics(r)
        self.alerts = Counter("vigil_rl_alerts", "RL-health alerts raised", ["kind"], registry=r)
        for kind in ALERT_KINDS:
            self.alerts.labels(kind=kind)
        for flag in ("true", "false"):
            self.executions.labels(timed_out=flag)

    def _art_metrics(self, r: CollectorRegistry) -> None:
        """ART (image / video generation): gauges of the latest closed policy version."""
        self.art_version = Gauge(
            "vigil_rl_art_version", "ART: latest closed policy version", registry=r
        )
        self.art_masked_share = Gauge(
            "vigil_rl_art_masked_share", "ART: share of states masked by the trust region",
            registry=r,
        )
        self.art_masked_trend = Gauge(
            "vigil_rl_art_masked_share_trend",
            "ART: slope of the masked share per version over the last versions",
            registry=r,
        )
        self.art_drift_norm = Gauge(
            "vigil_rl_art_drift_norm", "ART: mean drift norm |d|, d = v_theta - v_theta0",
            registry=r,
        )
        self.art_drift_dot_g = Gauge(
            "vigil_rl_art_drift_dot_g", "ART: mean <d, G> over the states", registry=r
        )
        self.art_no_signal = Gauge(
            "vigil_rl_art_no_signal_share",
            "ART: share of prompts whose K rewards are equal (Z_c under the floor)",
            registry=r,
        )
        self.art_diversity = Gauge(
            "vigil_rl_art_endpoint_diversity",
            "ART: mean pairwise embedding distance of a prompt's endpoints, mean over prompts",
            registry=r,
        )
        self.art_reward = Gauge("vigil_rl_art_reward_mean", "ART: mean reward R", registry=r)
        self.art_head_reward = Gauge(
            "vigil_rl_art_head_reward_mean", "ART: mean reward per reward model", ["head"],
            registry=r,
        )
        self.art_head_divergence = Gauge(
            "vigil_rl_art_head_divergence",
            "ART: a head's change minus the others' median, in baseline sd",
            ["head"],
            registry=r,
        )
        self.art_collapsed = Gauge(
            "vigil_rl_art_collapsed_prompts",
            "ART: prompts whose reward rises while their endpoints collapse",
            registry=r,
        )

    def set_art_version(self, v: ArtVersionSignals) -> None:
        self.art_version.set(v.version)
        self.art_collapsed.set(len(v.collapsed_prompts))
        for gauge, value in (
            (self.art_masked_share, v.masked_share),
            (self.art_masked_trend, v.masked_share_trend),
            (self.art_drift_norm, v.drift_norm_mean),
            (self.art_drift_dot_g, v.drift_dot_g_mean),
            (self.art_no_signal, v.no_signal_share),
            (self.art_diversity, v.diversity_mean),
            (self.art_reward, v.reward_mean),
        ):
            if value is not None:
                gauge.set(value)
        for head, value in v.head_means.items():
            self.art_head_reward.labels(head=head).set(value)
        for head, value in v.head_divergence.items():
            self.art_head_divergence.labels(head=head).set(value)

    def observe_execution(self, ex: ExecutionSignals) -> None:
        self.executions.labels(timed_out="true" if ex.timed_out else "false").inc()
        if ex.staleness is not None:
            self.staleness.observe(ex.staleness)
        self.duration.observe(ex.duration_s)
        if ex.timed_out and ex.reward is not None:
            self.timeout_reward.observe(ex.reward)
        for role in ex.admitted_roles:
            self.admitted.labels(role=role).inc()
        self.dropped.inc(ex.dropped)
        self.node_occurrences.inc(ex.node_occurrences)
        self.unique_nodes.inc(ex.unique_nodes)
        if ex.node_occurrences:
            self.dedup_ratio.observe(ex.dedup_ratio)
        for c in ex.call_signals:
            self.drift.observe(abs(c.drift_nats))
            self.log_turn_ratio.observe(abs(c.log_turn_ratio))

    def set_version(self, v: VersionSignals, expected_staleness: float) -> None:
        self.version.set(v.version)
        self.staleness_expected.set(expected_staleness)
        if v.staleness_mean is not None:
            self.staleness_mean.set(v.staleness_mean)
        if v.drift_abs_mean is not None:
            self.drift_nats.set(v.drift_abs_mean)
        if v.out_of_trust_share is not None:
            self.out_of_trust.set(v.out_of_trust_share)

    def set_mismatch(self, v: VersionSignals, relative_extra: float | None) -> None:
        if v.mismatch_abs_mean is not None:
            self.mismatch.set(v.mismatch_abs_mean)
        if v.k3_kl_mean is not None:
            self.mismatch_k3.set(v.k3_kl_mean)
        if relative_extra is not None:
            self.mismatch_relative.set(relative_extra)

    def observe_group(self, g: GroupSignals) -> None:
        self.group_reward.observe(g.reward_mean)
        if g.reward_hacking:
            self.reward_hacking.inc()

    def observe_alert(self, alert: Alert) -> None:
        self.alerts.labels(kind=alert.kind).inc()
