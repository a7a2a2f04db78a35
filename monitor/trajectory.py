"""Trajectory verdicts: one calibrated score and decision per trajectory from its steps.

Benchmarks such as ToolEmu label whole trajectories, and a reviewer triages runs, not
steps, so ``monitor screen`` reports a trajectory ``score`` and ``flagged`` beside each
step's. They come from the step **final scores** (the probability of harm from the deepest
gate each step reached, :class:`monitor.tiers.TierDecision`), aggregated with few
parameters. Two forms (a policy's trajectory section names its ``features``):

* **Length-aware** (:data:`NULL_FEATURES`, what calibration fits): each step score ``s`` is
  read against the **benign null**, the distribution of final step scores of benign
  calibration runs, as a tail probability ``p(s)`` (the share of benign steps scoring at least
  ``s``; past the highest benign score an exponential tail keeps higher scores rarer).
  ``null_max = -log P(the highest of n benign steps is this rare)`` ``= -log(1 - (1 -
  p_max)^n)``, and ``null_top2 = -log P(two of n benign steps are as rare as the second
  highest)`` (0 for one step). A benign run's steps are no more suspicious for being many:
  under the null the trajectory's evidence has the same distribution at every length, so a
  budget set on short runs holds on long ones (runs whose steps repeat score lower still).
* **Legacy** (:data:`FEATURES`, policies calibrated before 2026-12-07): ``logit(max s)``,
  ``logit(1 - prod(1 - s))`` (noisy-OR), ``logit(mean of the two highest s)`` and ``log n``.
  Noisy-OR over many small scores and the weight on ``log n`` make long benign runs look
  harmful (a team's 40-step coding runs: 88 of 100 flagged).

* **Score**: class-balanced logistic regression (Platt) on the standardised features,
  ``sigmoid(coef . (f - mean) / scale + intercept)``, rounded to 6 decimals. The weights
  of the score features are constrained non-negative, so raising any step's score never
  lowers its trajectory's (``log n`` may weigh either way).
* **Flagged**: ``score >= threshold`` **or any step flagged** (a step that would page a
  human always flags its trajectory). The threshold spends the trajectory ``budget``
  (default 5 %) of benign calibration trajectories: benign trajectories already flagged
  through a step count against it first, and when they alone exceed it the threshold is
  above 1 (no trajectory is flagged by its score).

:func:`monitor.calibrate.calibrate` fits it on the ``train`` and ``val`` trajectories of the
calibration data; ``bench/trajectory_bench.py`` chose the form by leave-one-domain-out. A
policy without it (files calibrated before it existed) falls back to ``score = max step
score`` and ``flagged = any step flagged`` (:func:`aggregate` with ``params=None``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

FEATURES = ("logit_max", "logit_noisy_or", "logit_top2_mean", "log_steps")  # legacy form
NULL_FEATURES = ("null_max", "null_top2")
FORMS: dict[str, tuple[str, ...]] = {
    "legacy": FEATURES, "null": NULL_FEATURES, "null_max": ("null_max",),
    "max": ("logit_max",),
}
DEFAULT_FORM = "null"
_MONOTONE = {"log_steps": False}  # every other feature's weight is constrained non-negative
DEFAULT_TRAJECTORY_BUDGET = 0.05
EPS = 1e-4
DECIMALS = 6  # trajectory scores are rounded like step scores; flagged compares the rounded one
NEVER = math.nextafter(1.0, 2.0)  # a threshold no score reaches
NULL_POINTS = 257  # quantiles of benign step logits a length-aware aggregation keeps


def _logit(p: float) -> float:
    p = min(max(p, EPS), 1 - EPS)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class BenignNull:
    """The benign step-score distribution a length-aware aggregation reads scores against:
    :data:`NULL_POINTS` quantiles of the logits of ``n`` benign steps' final scores."""

    quantiles: tuple[float, ...]
    n: int

    @classmethod
    def fit(cls, scores: Sequence[float]) -> BenignNull:
        x = np.array([_logit(float(s)) for s in scores])
        if not len(x):
            raise ValueError("the benign null needs benign step scores; there are none")
        q = np.quantile(x, np.linspace(0.0, 1.0, NULL_POINTS))
        return cls(tuple(float(v) for v in q), len(x))

    @cached_property
    def _curve(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        """What :meth:`tail` reads, derived once: the distinct quantiles with the share of
        benign steps below each (a tie counts from its first place: the share scoring *at
        least* a tied score includes the tie), the highest, and the tail's decay scale."""
        q = np.asarray(self.quantiles)
        u, first = np.unique(q, return_index=True)
        upper = q[q >= q[int(0.95 * (len(q) - 1))]]
        tau = max(float(np.mean(q[-1] - upper)) if len(upper) > 1 else 0.0, 0.25)
        return u, first / (len(q) - 1), float(q[-1]), tau

    def tail(self, scores: Sequence[float]) -> np.ndarray:
        """``p(s)``: the share of benign steps scoring at least ``s`` (at least
        ``1 / (n + 1)``, then shrinking exponentially past the highest benign score)."""
        u, below, top, tau = self._curve
        x = np.array([_logit(float(s)) for s in scores])
        floor = 1.0 / (self.n + 1)
        cdf = np.interp(x, u, below) if len(u) > 1 else np.zeros(len(x))
        beyond = floor * np.exp(-np.maximum(x - top, 0.0) / tau)
        return np.where(x > top, beyond, (1.0 - cdf) * (1 - floor) + floor)


def _at_least(k: int, n: int, p: float) -> float:
    """P(at least k of n independent steps have tail probability <= p)."""
    if k > n:
        return 1.0
    if k == 1:
        return -math.expm1(n * math.log1p(-min(p, 1 - 1e-12)))
    from scipy.special import betainc

    return float(betainc(k, n - k + 1, p))


@dataclass
class RunningScores:
    """What the aggregation needs of a run's step scores, kept as they come (a stream's open
    run in constant memory): the count, the two highest (clipped) and ``sum log(1 - s)``."""

    n: int = 0
    top: tuple[float, ...] = ()
    log_none: float = 0.0

    def add(self, score: float) -> None:
        v = min(max(float(score), EPS), 1 - EPS)
        self.n += 1
        self.top = tuple(sorted((*self.top, v), reverse=True)[:2])
        self.log_none += math.log1p(-v)

    @classmethod
    def of(cls, step_scores: Sequence[float]) -> RunningScores:
        r = cls()
        for v in sorted(step_scores, reverse=True):  # the same sum, whatever the order given
            r.add(v)
        return r


def trajectory_features(
    step_scores: Sequence[float] | RunningScores,
    names: Sequence[str] = FEATURES,
    null: BenignNull | None = None,
) -> np.ndarray:
    """The aggregation features ``names`` of one trajectory's step scores (or their running
    summary); ``null_*`` features need the benign ``null``."""
    r = step_scores if isinstance(step_scores, RunningScores) else RunningScores.of(step_scores)
    if not r.n:
        raise ValueError("a trajectory with no steps has no features")
    n, s = r.n, r.top
    out: list[float] = []
    tails: np.ndarray | None = None
    for name in names:
        if name.startswith("null_"):
            if null is None:
                raise ValueError(f"the trajectory feature {name} needs the benign null")
            if tails is None:
                tails = null.tail(s)
            k = 1 if name == "null_max" else 2
            p = _at_least(k, n, float(tails[k - 1])) if k <= n else 1.0
            out.append(-math.log(max(p, 1e-300)))
        elif name == "logit_max":
            out.append(_logit(s[0]))
        elif name == "logit_noisy_or":
            out.append(_logit(-math.expm1(r.log_none)))
        elif name == "logit_top2_mean":
            out.append(_logit(sum(s) / len(s)))
        elif name == "log_steps":
            out.append(math.log(n))
        else:
            raise ValueError(f"unknown trajectory feature {name!r}")
    return np.array(out)


@dataclass(frozen=True)
class TrajectoryAggregation:
    """The fitted aggregation (the ``trajectory`` section of a calibrated policy)."""

    coef: tuple[float, ...]
    intercept: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    threshold: float
    budget: float = DEFAULT_TRAJECTORY_BUDGET
    C: float = 1.0
    features: tuple[str, ...] = FEATURES
    null: BenignNull | None = None

    def score(self, step_scores: Sequence[float] | RunningScores) -> float:
        """The trajectory score in [0, 1] (0 for a trajectory without steps)."""
        if (step_scores.n if isinstance(step_scores, RunningScores) else len(step_scores)) == 0:
            return 0.0
        f = trajectory_features(step_scores, self.features, self.null)
        z = (f - np.asarray(self.mean)) / np.asarray(self.scale)
        logit = float(np.clip(z @ np.asarray(self.coef) + self.intercept, -50, 50))
        return round(1.0 / (1.0 + math.exp(-logit)), DECIMALS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "mean": list(self.mean),
            "scale": list(self.scale),
            "threshold": self.threshold,
            "budget": self.budget,
            "C": self.C,
            **({"null": {"logit_quantiles": list(self.null.quantiles), "steps": self.null.n}}
               if self.null is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrajectoryAggregation:
        features = tuple(d.get("features", FEATURES))
        known = {f for form in FORMS.values() for f in form}
        if unknown := [f for f in features if f not in known]:
            raise ValueError(f"trajectory features {unknown} are unknown to this build; it "
                             f"computes {sorted(known)}")
        coef, mean, scale = (tuple(float(v) for v in d[k]) for k in ("coef", "mean", "scale"))
        if not len(coef) == len(mean) == len(scale) == len(features):
            raise ValueError(f"trajectory coef, mean and scale need {len(features)} values each")
        null = None
        if any(f.startswith("null_") for f in features):
            nd = d.get("null")
            if not isinstance(nd, Mapping) or len(nd.get("logit_quantiles", ())) < 2:
                raise ValueError("trajectory features null_* need the section's null "
                                 "(logit_quantiles of benign step scores, and steps)")
            null = BenignNull(tuple(float(v) for v in nd["logit_quantiles"]), int(nd["steps"]))
        return cls(coef, float(d["intercept"]), mean, scale, float(d["threshold"]),
                   float(d.get("budget", DEFAULT_TRAJECTORY_BUDGET)), float(d.get("C", 1.0)),
                   features, null)


def aggregate(
    step_scores: Sequence[float],
    step_flags: Sequence[bool],
    params: TrajectoryAggregation | None,
) -> tuple[float, bool]:
    """``(score, flagged)`` of one trajectory from its steps' final scores and flags.

    ``params=None`` (a policy without a trajectory section): the highest step score, and
    flagged when any step is.
    """
    if len(step_scores) != len(step_flags):
        raise ValueError(f"{len(step_scores)} step scores but {len(step_flags)} step flags")
    paged = any(step_flags)
    if params is None:
        return round(max((float(s) for s in step_scores), default=0.0), DECIMALS), paged
    score = params.score(step_scores)
    return score, paged or score >= params.threshold


def budget_threshold(
    scores: np.ndarray, paged: np.ndarray, budget: float
) -> float:
    """Lowest threshold at which benign trajectories flagged by their score or a step
    (``paged``) are at most ``budget`` of them; :data:`NEVER` when the steps spend it."""
    scores, paged = np.asarray(scores, dtype=np.float64), np.asarray(paged, dtype=bool)
    allowed = math.floor(budget * len(scores) + 1e-9) - int(paged.sum())
    rest = np.sort(scores[~paged])[::-1]
    if allowed < 0 or not len(rest):
        return NEVER
    if allowed >= len(rest):
        return float(rest[-1])
    return float(np.nextafter(rest[allowed], np.inf))


def fit_aggregation(
    step_scores: Sequence[Sequence[float]],
    step_flags: Sequence[Sequence[bool]],
    y: np.ndarray,
    *,
    budget: float = DEFAULT_TRAJECTORY_BUDGET,
    C: float = 1.0,
    form: str = DEFAULT_FORM,
) -> TrajectoryAggregation:
    """Fit the aggregation of ``form`` (:data:`FORMS`) on labelled trajectories (one list of
    step scores and flags each) and set its threshold at ``budget`` of the benign ones. The
    length-aware forms read step scores against every step of the benign trajectories."""
    from scipy.optimize import minimize

    y = np.asarray(y, dtype=np.float64)
    if len(y) != len(step_scores) or len(y) != len(step_flags):
        raise ValueError("one label, one list of step scores and one of flags per trajectory")
    if any(not len(s) for s in step_scores):
        raise ValueError("every trajectory needs at least one step")
    if not 0 < y.sum() < len(y):
        raise ValueError(
            f"the {len(y)} trajectories are all {'harmful' if y.sum() else 'benign'}; "
            "the aggregation needs both"
        )
    if form not in FORMS:
        raise ValueError(f"unknown trajectory form {form!r}; known: {sorted(FORMS)}")
    names = FORMS[form]
    null = None
    if any(f.startswith("null_") for f in names):
        null = BenignNull.fit([v for s, lab in zip(step_scores, y, strict=True) if lab == 0
                               for v in s])
    F = np.stack([trajectory_features(s, names, null) for s in step_scores])
    mean = F.mean(axis=0)
    std = F.std(axis=0)
    scale = np.where(std > 1e-9, std, 1.0)
    Z = (F - mean) / scale
    pos = y.sum()
    w = np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * (len(y) - pos)))
    w = w / w.sum()
    d = Z.shape[1]
    lam = 1.0 / (C * len(y))

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        coef, b = theta[:d], theta[d]
        z = Z @ coef + b
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))
        g = w * (p - y)
        val = float((w * (np.logaddexp(0.0, z) - y * z)).sum() + 0.5 * lam * coef @ coef)
        return val, np.concatenate([Z.T @ g + lam * coef, [g.sum()]])

    bounds = [(0.0, None) if _MONOTONE.get(f, True) else (None, None) for f in names]
    bounds.append((None, None))
    res = minimize(loss, np.zeros(d + 1), jac=True, method="L-BFGS-B", bounds=bounds)
    unthresholded = TrajectoryAggregation(
        tuple(float(v) for v in res.x[:d]), float(res.x[d]),
        tuple(float(v) for v in mean), tuple(float(v) for v in scale), NEVER, budget, C,
        names, null,
    )
    scores = np.array([unthresholded.score(s) for s in step_scores])
    paged = np.array([any(f) for f in step_flags], dtype=bool)
    benign = y == 0
    threshold = budget_threshold(scores[benign], paged[benign], budget)
    return TrajectoryAggregation(
        unthresholded.coef, unthresholded.intercept, unthresholded.mean, unthresholded.scale,
        threshold, budget, C, names, null,
    )
