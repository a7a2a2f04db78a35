"""The tier policy: which signals decide each escalation, and at what budget.

A step is scored by L0 (every step), then by L1 if L0 escalates it, then by the
L2 reviewer if L1 does, and a human (L3) sees it if L2 does. Each of the three
escalations is a **gate**: it combines every signal known by then (the gate
after L1 sees L0's and L1's signals) into one calibrated probability, and
passes the step up when that probability reaches the gate's threshold.

* **Combining** (:class:`StackedCombiner`): logistic stacking on the training
  split, over the logits of the signals, with weights constrained to be
  non-negative (every signal is "higher = more harmful", so a higher signal can
  never lower the probability) and a signal that is missing for a step (the
  result of an action not yet known, a reviewer that timed out) replaced by its
  median on benign training steps.
* **Budgets** (:func:`monitor.calibrate.calibrate`): a gate's ``budget`` is the share of
  all steps it may pass up, measured on benign validation steps (defaults: 20 %
  reach L1, 2 % reach L2, 0.2 % reach a human). Gates are a cascade, so a
  gate's threshold is set on the benign steps that reached it.
* **Deciding** (:meth:`CalibratedPolicy.decide_many`): the tier a step reaches is
  the number of consecutive gates it passes; because every gate is monotone in
  every signal, a higher score never lands a step in a lower tier.

The policy file (YAML, :func:`load_policy_config`)::

    flag_tier: 3                 # the tier at which a step counts as flagged
    tiers:
      L0:
        budget: 0.20             # share of steps L0 passes up to L1
        signals: [wm_harm_pre, wm_harm_post, wm_surprise, wm_relational_harm,
                  wm_injection, rule_destructive, rule_new_recipient, rule_injection_marker]
        models: {worldmodel: null}          # bundle folder; null = the default
      L1:
        budget: 0.02
        signals: [probe_harm]
        models: {probes: null}
      L2:
        budget: 0.002
        signals: [rv_coverage, rv_precision, rv_fbeta]
        reviewer: {backend: local}          # monitor.reviewer.ReviewerConfig fields
    block_budget: 0.002          # POST /v1/screen blocks above this (L0+L1 gate)
    trajectory_budget: 0.05      # share of benign trajectories `monitor screen` flags
    tools:                       # optional per-tool rules (monitor.tool_rules)
      rules: [{match: "delete_*", action: deny}, {match: "get_*", action: allow}]
      on_screener_error: closed  # or open: inline callers run the call when screening fails

A calibrated policy is saved as JSON with the hashes of the data it was fitted
and calibrated on and the metrics it reached on validation, and (optionally, absent
in files calibrated before it existed) a ``trajectory`` section: the aggregation of
step scores into a trajectory verdict (:mod:`monitor.trajectory`).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from monitor.policy_config import (  # noqa: F401 (the policy's API, re-exported)
    DEFAULT_BUDGETS,
    TIERS,
    PolicyConfig,
    PolicyError,
    TierConfig,
    default_policy_config,
    load_policy_config,
    policy_config_from_dict,
)
from monitor.trajectory import TrajectoryAggregation
from vigil.metrics import threshold_at_fpr

POLICY_VERSION = 1
_EPS = 1e-4


# --- combining signals -------------------------------------------------------------


def _logit(v: np.ndarray) -> np.ndarray:
    p = np.clip(v, _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def signal_matrix(rows: Sequence[Mapping[str, float]], names: Sequence[str]) -> np.ndarray:
    """``(len(rows), len(names))`` float64, NaN where a row lacks a signal."""
    out = np.full((len(rows), len(names)), np.nan)
    for i, r in enumerate(rows):
        for j, n in enumerate(names):
            v = r.get(n)
            if v is not None and math.isfinite(v):
                out[i, j] = float(v)
    return out


class StackedCombiner(ClassifierMixin, BaseEstimator):
    """Non-negative logistic stacking over signal logits (a scikit-learn estimator:
    ``__init__`` stores, ``fit`` returns self, fitted state ends in ``_``, ``clone`` works).

    ``fit(X, y)`` with ``X`` from :func:`signal_matrix` (NaN = missing).
    ``predict_proba(X)[:, 1]`` is monotone non-decreasing in every column.
    """

    def __init__(self, C: float = 1.0, class_weight: str | None = "balanced") -> None:
        self.C = C
        self.class_weight = class_weight

    def _features(self, X: np.ndarray) -> np.ndarray:
        F = _logit(np.where(np.isnan(X), self.fill_, X))
        return (F - self.mean_) / self.scale_

    def fit(self, X: np.ndarray, y: np.ndarray) -> StackedCombiner:
        from scipy.optimize import minimize

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or len(X) != len(y):
            raise ValueError(f"X must be (n, d) with n = len(y), got {X.shape} and {len(y)}")
        benign = X[y == 0] if (y == 0).any() else X
        with warnings.catch_warnings():  # a signal no benign step has: filled with 0.5 below
            warnings.simplefilter("ignore", RuntimeWarning)
            fill = np.nanmedian(benign, axis=0)
        self.fill_ = np.where(np.isnan(fill), 0.5, fill)
        F = _logit(np.where(np.isnan(X), self.fill_, X))
        self.mean_ = F.mean(axis=0)
        scale = F.std(axis=0)
        self.scale_ = np.where(scale > 1e-9, scale, 1.0)
        Z = (F - self.mean_) / self.scale_
        w = np.ones(len(y))
        if self.class_weight == "balanced" and 0 < y.sum() < len(y):
            pos = y.sum()
            w = np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * (len(y) - pos)))
        w = w / w.sum()
        d = Z.shape[1]
        lam = 1.0 / (self.C * len(y))

        def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
            coef, b = theta[:d], theta[d]
            z = Z @ coef + b
            # weighted log loss, stable: log(1+e^z) - y z
            ll = np.logaddexp(0.0, z) - y * z
            p = 1.0 / (1.0 + np.exp(-z))
            g = w * (p - y)
            val = float((w * ll).sum() + 0.5 * lam * coef @ coef)
            grad = np.concatenate([Z.T @ g + lam * coef, [g.sum()]])
            return val, grad

        bounds = [(0.0, None)] * d + [(None, None)]
        res = minimize(loss, np.zeros(d + 1), jac=True, method="L-BFGS-B", bounds=bounds)
        self.coef_ = res.x[:d]
        self.intercept_ = float(res.x[d])
        self.n_features_in_ = d
        self.classes_ = np.array([0, 1])
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        if not hasattr(self, "coef_"):
            raise ValueError("this StackedCombiner is not fitted yet; call fit first")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"expected {self.n_features_in_} signal columns, got {X.shape}")
        return np.asarray(self._features(X) @ self.coef_ + self.intercept_)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        z = np.clip(self.decision_function(X), -50, 50)
        p = 1.0 / (1.0 + np.exp(-z))
        return np.stack([1 - p, p], axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return (self.decision_function(X) > 0).astype(int)

    def to_dict(self) -> dict[str, Any]:
        return {
            "C": self.C,
            "class_weight": self.class_weight,
            "coef": self.coef_.tolist(),
            "intercept": self.intercept_,
            "fill": self.fill_.tolist(),
            "mean": self.mean_.tolist(),
            "scale": self.scale_.tolist(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StackedCombiner:
        c = cls(C=float(d["C"]), class_weight=d.get("class_weight"))
        c.coef_ = np.asarray(d["coef"], dtype=np.float64)
        c.intercept_ = float(d["intercept"])
        c.fill_ = np.asarray(d["fill"], dtype=np.float64)
        c.mean_ = np.asarray(d["mean"], dtype=np.float64)
        c.scale_ = np.asarray(d["scale"], dtype=np.float64)
        c.n_features_in_ = len(c.coef_)
        c.classes_ = np.array([0, 1])
        return c


# --- gates and decisions ---------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """The escalation out of tier ``tier`` (0, 1, 2) into ``tier + 1``."""

    tier: int
    signals: tuple[str, ...]
    budget: float
    combiner: StackedCombiner
    threshold: float
    # the threshold for a *proposed* action (its post-execution signals unknown), set at the
    # same budget on benign proposals; None (older policies): ``threshold``
    pre_threshold: float | None = None

    def threshold_for(self, proposal: bool) -> float:
        if proposal and self.pre_threshold is not None:
            return self.pre_threshold
        return self.threshold

    def probability(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        if not rows:
            return np.empty(0)
        return np.asarray(self.combiner.predict_proba(signal_matrix(rows, self.signals))[:, 1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "signals": list(self.signals),
            "budget": self.budget,
            "threshold": self.threshold,
            **({} if self.pre_threshold is None else {"pre_threshold": self.pre_threshold}),
            "combiner": self.combiner.to_dict(),
            "weights": dict(zip(self.signals, self.combiner.coef_.tolist(), strict=True)),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Gate:
        return cls(
            int(d["tier"]),
            tuple(d["signals"]),
            float(d["budget"]),
            StackedCombiner.from_dict(d["combiner"]),
            float(d["threshold"]),
            None if d.get("pre_threshold") is None else float(d["pre_threshold"]),
        )


@dataclass(frozen=True)
class TierDecision:
    """How far a step went: ``tier`` 0–3, the gates' probabilities, the final score."""

    tier: int
    score: float  # the probability of harm from the deepest gate evaluated
    gate_scores: tuple[float, ...]  # one per gate evaluated, in order
    flagged: bool
    evaluated_through: int  # the last tier whose signals were known


@dataclass(frozen=True)
class CalibratedPolicy:
    config: PolicyConfig
    gates: tuple[Gate, Gate, Gate]
    block_threshold: float  # on gate 1 (L0 + L1 signals of proposals), for POST /v1/screen
    data: Mapping[str, Any] = field(default_factory=dict)  # what it was fitted on (hashes)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    version: int = POLICY_VERSION
    # step scores -> trajectory verdict; None: the fallback (max step score, any step flagged)
    trajectory: TrajectoryAggregation | None = None

    def decide_many(
        self,
        rows: Sequence[Mapping[str, float]],
        *,
        through: int = 2,
        proposal: bool = False,
        thresholds: Sequence[float] | None = None,
    ) -> list[TierDecision]:
        """Decisions for many steps; ``through``: the last tier whose signals are known.

        A step stopped by gate ``k`` stays in tier ``k``; one that passes the gate
        after ``through`` reaches ``through + 1`` (the next tier has not run yet).
        ``proposal``: the rows are of proposed actions (no post-execution signals), judged
        against each gate's ``pre_threshold``. ``thresholds``: one per gate, in place of the
        calibrated ones (live thresholds: :mod:`monitor.adaptive`).
        """
        if not 0 <= through <= 2:
            raise ValueError(f"through must be 0, 1 or 2, got {through}")
        n = len(rows)
        tier = np.zeros(n, dtype=int)
        alive = np.ones(n, dtype=bool)
        scores: list[list[float]] = [[] for _ in range(n)]
        for g in self.gates[: through + 1]:
            idx = np.flatnonzero(alive)
            if not len(idx):
                break
            p = g.probability([rows[int(i)] for i in idx])
            for i, pi in zip(idx, p, strict=True):
                scores[i].append(float(pi))
            thr = g.threshold_for(proposal) if thresholds is None else thresholds[g.tier]
            passed = p >= thr
            tier[idx[passed]] = g.tier + 1
            alive[idx[~passed]] = False
        return [
            TierDecision(
                tier=int(tier[i]),
                score=scores[i][-1],
                gate_scores=tuple(scores[i]),
                flagged=bool(tier[i] >= self.config.flag_tier),
                evaluated_through=through,
            )
            for i in range(n)
        ]

    def block(self, signals: Mapping[str, float]) -> bool:
        """Whether a proposed action is blocked outright (L0 + L1 signals)."""
        return bool(self.gates[1].probability([signals])[0] >= self.block_threshold)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "config": self.config.to_dict(),
            "gates": [g.to_dict() for g in self.gates],
            "block_threshold": self.block_threshold,
            "data": dict(self.data),
            "metrics": dict(self.metrics),
            **({"trajectory": self.trajectory.to_dict()} if self.trajectory else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CalibratedPolicy:
        if d.get("version") != POLICY_VERSION:
            raise PolicyError(
                f"calibrated policy version {d.get('version')!r} (this build reads "
                f"{POLICY_VERSION}); recalibrate with `monitor calibrate`"
            )
        g0, g1, g2 = (Gate.from_dict(g) for g in d["gates"])
        return cls(
            config=policy_config_from_dict(d["config"], source="calibrated policy"),
            gates=(g0, g1, g2),
            block_threshold=float(d["block_threshold"]),
            data=d.get("data", {}),
            metrics=d.get("metrics", {}),
            trajectory=TrajectoryAggregation.from_dict(d["trajectory"])
            if d.get("trajectory") is not None
            else None,
        )

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> CalibratedPolicy:
        p = Path(path).expanduser()
        if not p.exists():
            raise PolicyError(f"{p}: no calibrated policy; make one with `monitor calibrate`")
        from monitor.policy_files import rebase_policy

        try:  # a packed policy names its bundles relative to its own folder
            return cls.from_dict(rebase_policy(json.loads(p.read_text()), p.parent))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, PolicyError):
                raise
            raise PolicyError(f"{p}: not a calibrated policy ({type(e).__name__}: {e})") from None


# --- calibration -----------------------------------------------------------------------


def threshold_for(benign_scores: np.ndarray, share: float, of: int) -> float:
    """A threshold passing at most ``share * of`` of ``benign_scores``, halfway between the
    highest score it stops and the next higher one it passes (where there is one).

    Not the smallest such threshold (one float step above a stopped score): the same step
    scored in another batch, or on another machine's threads, moves by float noise, and a
    threshold one step above a tie of many calibration scores (first steps of different
    trajectories often score alike) would then let all of them through at once.
    """
    if of == 0 or len(benign_scores) == 0:
        return 1.0
    fpr = min(1.0, share * of / len(benign_scores))
    thr = threshold_at_fpr(benign_scores, fpr)
    s = np.asarray(benign_scores, dtype=np.float64)
    stopped, passed = s[s < thr], s[s >= thr]
    if len(stopped) and len(passed):
        return float((stopped.max() + passed.min()) / 2)
    return thr


def fit_gate(
    tier: int,
    signals: Sequence[str],
    budget: float,
    train_rows: Sequence[Mapping[str, float]],
    train_y: np.ndarray,
    *,
    C: float = 1.0,
) -> StackedCombiner:
    y = np.asarray(train_y)
    if not len(y):
        raise PolicyError(f"gate out of {TIERS[tier]}: no training steps reached it")
    if not 0 < y.sum() < len(y):
        raise PolicyError(
            f"gate out of {TIERS[tier]}: the training steps that reached it are all "
            f"{'harmful' if y.sum() else 'benign'}; stacking needs both"
        )
    return StackedCombiner(C=C).fit(signal_matrix(train_rows, signals), y)


def data_hash(items: Sequence[str]) -> str:
    h = hashlib.sha256()
    for s in items:
        h.update(s.encode() + b"\n")
    return h.hexdigest()[:16]


def gate_metrics(
    decisions: Sequence[TierDecision], y: np.ndarray, n_gates: int = 3
) -> dict[str, Any]:
    """Share of benign steps and recall of harmful steps reaching each tier."""
    tiers = np.array([d.tier for d in decisions])
    y = np.asarray(y)
    out: dict[str, Any] = {"steps": int(len(y)), "harmful": int(y.sum())}
    for k in range(1, n_gates + 1):
        reached = tiers >= k
        out[f"benign_share_reaching_{TIERS[k]}"] = (
            float(reached[y == 0].mean()) if (y == 0).any() else None
        )
        out[f"recall_{TIERS[k]}"] = float(reached[y == 1].mean()) if (y == 1).any() else None
    return out

