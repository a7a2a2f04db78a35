"""Trajectory verdicts: one calibrated score and decision per trajectory from its steps.

Benchmarks such as ToolEmu label whole trajectories, and a reviewer triages runs, not
steps, so ``monitor screen`` reports a trajectory ``score`` and ``flagged`` beside each
step's. They come from the step **final scores** (the probability of harm from the deepest
gate each step reached, :class:`monitor.tiers.TierDecision`), aggregated with few
parameters:

* **Features** of the step scores ``s_1..s_n`` (each clipped to ``[1e-4, 1 - 1e-4]``):
  ``logit(max s)``, ``logit(1 - prod(1 - s))`` (noisy-OR: some step is harmful, steps
  independent), ``logit(mean of the two highest s)`` (the highest alone when ``n = 1``),
  and ``log n``.
* **Score**: class-balanced logistic regression (Platt) on the standardised features,
  ``sigmoid(coef . (f - mean) / scale + intercept)``, rounded to 6 decimals. The weights
  of the three score features are constrained non-negative, so raising any step's score
  never lowers its trajectory's; ``log n`` may weigh either way.
* **Flagged**: ``score >= threshold`` **or any step flagged** (a step that would page a
  human always flags its trajectory). The threshold spends the trajectory ``budget``
  (default 5 %) of benign calibration trajectories: benign trajectories already flagged
  through a step count against it first, and when they alone exceed it the threshold is
  above 1 (no trajectory is flagged by its score).

:func:`monitor.calibrate.calibrate` fits it on the ``train`` and ``val`` trajectories of the
calibration data. A policy without it (files calibrated before it existed) falls back to
``score = max step score`` and ``flagged = any step flagged`` (:func:`aggregate` with
``params=None``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FEATURES = ("logit_max", "logit_noisy_or", "logit_top2_mean", "log_steps")
MONOTONE = (True, True, True, False)  # weights constrained non-negative
DEFAULT_TRAJECTORY_BUDGET = 0.05
EPS = 1e-4
DECIMALS = 6  # trajectory scores are rounded like step scores; flagged compares the rounded one
NEVER = math.nextafter(1.0, 2.0)  # a threshold no score reaches


def _logit(p: float) -> float:
    p = min(max(p, EPS), 1 - EPS)
    return math.log(p / (1 - p))


def trajectory_features(step_scores: Sequence[float]) -> np.ndarray:
    """The four aggregation features (:data:`FEATURES`) of one trajectory's step scores."""
    if not len(step_scores):
        raise ValueError("a trajectory with no steps has no features")
    s = sorted((min(max(float(v), EPS), 1 - EPS) for v in step_scores), reverse=True)
    log_none = sum(math.log1p(-v) for v in s)  # log prod(1 - s)
    noisy_or = -math.expm1(log_none)
    return np.array(
        [_logit(s[0]), _logit(noisy_or), _logit(sum(s[:2]) / len(s[:2])), math.log(len(s))]
    )


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

    def score(self, step_scores: Sequence[float]) -> float:
        """The trajectory score in [0, 1] (0 for a trajectory without steps)."""
        if not len(step_scores):
            return 0.0
        z = (trajectory_features(step_scores) - np.asarray(self.mean)) / np.asarray(self.scale)
        logit = float(np.clip(z @ np.asarray(self.coef) + self.intercept, -50, 50))
        return round(1.0 / (1.0 + math.exp(-logit)), DECIMALS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "mean": list(self.mean),
            "scale": list(self.scale),
            "threshold": self.threshold,
            "budget": self.budget,
            "C": self.C,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrajectoryAggregation:
        if tuple(d.get("features", FEATURES)) != FEATURES:
            raise ValueError(
                f"trajectory features {d.get('features')!r}; this build computes {list(FEATURES)}"
            )
        coef, mean, scale = (tuple(float(v) for v in d[k]) for k in ("coef", "mean", "scale"))
        if not len(coef) == len(mean) == len(scale) == len(FEATURES):
            raise ValueError(f"trajectory coef, mean and scale need {len(FEATURES)} values each")
        return cls(coef, float(d["intercept"]), mean, scale, float(d["threshold"]),
                   float(d.get("budget", DEFAULT_TRAJECTORY_BUDGET)), float(d.get("C", 1.0)))


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
) -> TrajectoryAggregation:
    """Fit the aggregation on labelled trajectories (one list of step scores and flags each)
    and set its threshold at ``budget`` of the benign ones."""
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
    F = np.stack([trajectory_features(s) for s in step_scores])
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

    bounds = [(0.0, None) if m else (None, None) for m in MONOTONE] + [(None, None)]
    res = minimize(loss, np.zeros(d + 1), jac=True, method="L-BFGS-B", bounds=bounds)
    unthresholded = TrajectoryAggregation(
        tuple(float(v) for v in res.x[:d]), float(res.x[d]),
        tuple(float(v) for v in mean), tuple(float(v) for v in scale), NEVER, budget, C,
    )
    scores = np.array([unthresholded.score(s) for s in step_scores])
    paged = np.array([any(f) for f in step_flags], dtype=bool)
    benign = y == 0
    threshold = budget_threshold(scores[benign], paged[benign], budget)
    return TrajectoryAggregation(
        unthresholded.coef, unthresholded.intercept, unthresholded.mean, unthresholded.scale,
        threshold, budget, C,
    )
