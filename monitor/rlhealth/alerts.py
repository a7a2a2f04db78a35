"""Alert rules over the per-version and per-group signals.

Each rule is a small pure function of closed versions (a version is closed
once a later one has been seen), so the stream and the offline report raise
the same alerts for the same records. An :class:`Alert` names its kind, the
version (or group) it is about, the value and the bound it crossed.

A rule says whether its condition holds at each closed version; an
:class:`AlertLatch` turns that into alerts that are edge-triggered: one when
the condition starts, none while it holds, and a new one only after it has
cleared (a trainer that stays behind for 50 versions is one alert, not 50).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from monitor.rlhealth.formulas import expected_staleness, relative_extra_discrepancy
from monitor.rlhealth.signals import GroupSignals, VersionSignals
from streams.processor import Output
from streams.records import Score

log = logging.getLogger(__name__)

AlertKind = Literal[
    "staleness",
    "drift",
    "mismatch",
    "reward_hacking",
    # ART (image / video generation, monitor.rlhealth.art)
    "art_mask",
    "art_drift",
    "art_no_signal",
    "art_collapse",
    "art_reward_divergence",
]
ALERT_KINDS: tuple[AlertKind, ...] = AlertKind.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Alert:
    kind: AlertKind
    version: int | None
    value: float
    threshold: float
    message: str
    subject: str = ""  # the group's query, ART's prompt or reward model

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.version}/{self.subject}"

    @property
    def condition(self) -> str:
        """What stays in the alert state across versions: the kind, and the group's query."""
        return condition_key(self.kind, self.subject)


def condition_key(kind: AlertKind, subject: str = "") -> str:
    return f"{kind}/{subject}"


class AlertLatch:
    """Edge-triggered alerts: a condition raises one alert when it starts to hold, none
    while it keeps holding, and a new one only once it has cleared and holds again.

    Feed it every judgement of a condition, in order: the rule's alert, or ``None``
    when the rule found the condition clear.
    """

    def __init__(self, on_raise: Callable[[Alert], None] | None = None) -> None:
        self._active: dict[str, Alert] = {}
        self.on_raise = on_raise  # e.g. the metrics' alert counter
        self.raised: list[Alert] = []  # every alert raised, in order

    def judge(self, condition: str, alert: Alert | None) -> Alert | None:
        """:meth:`update`, and an alert raised now is kept in :attr:`raised`, logged and
        passed to ``on_raise``; returns it (None when nothing was raised)."""
        alert = self.update(condition, alert)
        if alert is not None:
            self.raised.append(alert)
            log.warning("rlhealth alert: %s", alert.message)
            if self.on_raise is not None:
                self.on_raise(alert)
        return alert

    def update(self, condition: str, alert: Alert | None) -> Alert | None:
        """The alert to raise now: ``alert`` when ``condition`` was clear before, else None."""
        if alert is None:
            self._active.pop(condition, None)
            return None
        fresh = condition not in self._active
        self._active[condition] = alert  # the latest judgement, for reports
        return alert if fresh else None

    @property
    def active(self) -> list[Alert]:
        """The latest alert of every condition that still holds."""
        return list(self._active.values())


@dataclass(frozen=True)
class AlertConfig:
    """Bounds of the RL-health alerts (the run's configured φ, μ and tolerances)."""

    phi: float = 1.0
    mu: int = 1
    staleness_tolerance: float = 0.5  # |observed mean − E[d]| allowed, in versions
    staleness_window: int = 0  # versions averaged; 0 = the smallest multiple of μ >= 4
    staleness_warmup: int | None = None  # first versions skipped; None = ceil(φ)
    drift_growth: float = 1.5  # alert when mean |M| grows by more than this factor ...
    drift_min_nats: float = 1.0  # ... and is above this floor
    drift_window: int = 3  # ... against the mean of this many previous versions
    mismatch_reference: float | None = None  # D_ref; None = median of the first versions
    mismatch_reference_versions: int = 3
    mismatch_spike: float = 1.0  # alert when (D − D_ref)/D_ref exceeds this
    min_samples: int = 2  # a version with fewer samples is not judged

    @property
    def expected_staleness(self) -> float:
        return expected_staleness(self.phi, self.mu)

    @property
    def window(self) -> int:
        if self.staleness_window > 0:
            return self.staleness_window
        return self.mu * max(1, -(-4 // self.mu))

    @property
    def warmup(self) -> int:
        return int(np.ceil(self.phi)) if self.staleness_warmup is None else self.staleness_warmup


def staleness_alert(closed: Sequence[VersionSignals], cfg: AlertConfig) -> Alert | None:
    """The mean staleness of the last ``window`` closed versions (sample-weighted) leaves
    ``E[d] ± tolerance``. Judged once ``window`` versions past the warm-up are closed."""
    judged = [v for v in closed if v.version >= cfg.warmup and v.staleness_mean is not None]
    if len(judged) < cfg.window:
        return None
    last = judged[-cfg.window :]
    n = sum(sum(v.staleness_hist.values()) for v in last)
    if n < cfg.min_samples:
        return None
    mean = sum(d * c for v in last for d, c in v.staleness_hist.items()) / n
    expected = cfg.expected_staleness
    if abs(mean - expected) <= cfg.staleness_tolerance:
        return None
    return Alert(
        "staleness",
        last[-1].version,
        mean,
        expected,
        f"mean staleness {mean:.2f} over versions {last[0].version}..{last[-1].version} is "
        f"outside E[d] = φ + (μ − 1)/2 = {expected:.2f} ± {cfg.staleness_tolerance}",
    )


def drift_alert(closed: Sequence[VersionSignals], cfg: AlertConfig) -> Alert | None:
    """Early warning: the latest closed version's mean |M| is above ``drift_min_nats`` and
    more than ``drift_growth`` times the mean of the ``drift_window`` versions before it."""
    judged = [v for v in closed if v.drift_abs_mean is not None and v.sequences >= cfg.min_samples]
    if len(judged) < 2:
        return None
    cur = judged[-1]
    prev = judged[-1 - cfg.drift_window : -1]
    base = float(np.mean([v.drift_abs_mean for v in prev if v.drift_abs_mean is not None]))
    m = cur.drift_abs_mean
    assert m is not None
    if m < cfg.drift_min_nats or m <= cfg.drift_growth * base:
        return None
    growth = m / base if base > 0 else float("inf")
    return Alert(
        "drift",
        cur.version,
        m,
        cfg.drift_growth,
        f"off-policy drift mean |M| = {m:.2f} nats at version {cur.version} grew {growth:.1f}x "
        f"over the previous {len(prev)} versions ({base:.2f} nats): training may be about "
        "to collapse",
    )


def mismatch_reference(closed: Sequence[VersionSignals], cfg: AlertConfig) -> float | None:
    """``D_ref``: configured, or the median mismatch of the first closed versions."""
    if cfg.mismatch_reference is not None:
        return cfg.mismatch_reference
    first = [v.mismatch_abs_mean for v in closed if v.mismatch_abs_mean is not None][
        : cfg.mismatch_reference_versions
    ]
    if len(first) < cfg.mismatch_reference_versions:
        return None
    ref = float(np.median(first))
    return ref if ref > 0 else None


def mismatch_alert(by_policy: Sequence[VersionSignals], cfg: AlertConfig) -> Alert | None:
    """A spike of the rollout–training mismatch: the latest closed rollout (policy)
    version's mean ``|Δ log p|`` is more than ``mismatch_spike`` relative extra over
    ``D_ref``."""
    ref = mismatch_reference(by_policy, cfg)
    if ref is None or not by_policy:
        return None
    cur = by_policy[-1]
    if cur.mismatch_abs_mean is None or cur.sequences < cfg.min_samples:
        return None
    extra = relative_extra_discrepancy(cur.mismatch_abs_mean, ref)
    if extra <= cfg.mismatch_spike:
        return None
    return Alert(
        "mismatch",
        cur.version,
        extra,
        cfg.mismatch_spike,
        f"rollout–training mismatch {cur.mismatch_abs_mean:.4f} nats/token at policy version "
        f"{cur.version} is {extra:+.0%} over the reference {ref:.4f}",
    )


def reward_hacking_alert(group: GroupSignals) -> Alert | None:
    if not group.reward_hacking:
        return None
    why = (
        f"reward {group.reward_delta:+.2f} and harm {group.harm_delta:+.2f} both rose"
        if group.reward_delta is not None
        and group.harm_delta is not None
        and group.reward_delta > 0
        and group.harm_delta > 0
        else f"reward and harm correlate (r = {group.reward_harm_corr:.2f})"
    )
    return Alert(
        "reward_hacking",
        group.version,
        group.harm_mean if group.harm_mean is not None else 0.0,
        0.0,
        f"group {group.query_id} at version {group.version}: {why} — possible reward hacking",
        subject=group.query_id,
    )


def alert_score(alert: Alert) -> Score:
    """An alert as a flagged L0 record: ``trajectory_id`` names the run-level subject
    (``rlhealth/<kind>/<version>[/<query>]``), ``signals`` carry ``rl_alert_<kind>``."""
    subject = f"rlhealth/{alert.kind}/{alert.version}" + (
        f"/{alert.subject}" if alert.subject else ""
    )
    return Score(
        trajectory_id=subject,
        step_id="alert",
        tier=0,
        score=1.0,
        flagged=True,
        signals={
            f"rl_alert_{alert.kind}": 1.0,
            "rl_alert_value": float(alert.value) if np.isfinite(alert.value) else 1e9,
            "rl_alert_threshold": float(alert.threshold),
        },
        source="rollout",
        created_at=time.time(),
    )


def alert_outputs(topic: str, alerts: Sequence[Alert]) -> list[Output]:
    """Each alert as a flagged score on ``topic``, keyed and idempotent by its subject."""
    out = []
    for a in alerts:
        score = alert_score(a)
        out.append(
            Output(topic, score, key=score.trajectory_id, idempotency_key=score.idempotency_key)
        )
    return out
