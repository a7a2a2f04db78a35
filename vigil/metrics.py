"""The few numbers every tier is judged by, and the logistic function behind its scores.

One implementation for model evaluation (world model, probes), calibration, the benches and
the dashboards, so an AUROC or a "recall at 1 % FPR" means the same thing everywhere:
``auroc``, ``recall_at_fpr``, ``threshold_at_fpr``, ``wilson_interval`` and ``sigmoid``.
"""

from __future__ import annotations

import numpy as np


def _both_classes(y: np.ndarray) -> bool:
    return bool(0 < np.asarray(y).sum() < len(y))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, clipped so that no logit overflows."""
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50, 50)))


def auroc(y: np.ndarray, scores: np.ndarray) -> float | None:
    """Area under the ROC curve; None when ``y`` holds only one class."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    return float(roc_auc_score(y, scores)) if _both_classes(y) else None


def auroc_or_nan(y: np.ndarray, scores: np.ndarray) -> float:
    """:func:`auroc`, NaN where it is undefined (for tables that average over folds)."""
    v = auroc(y, scores)
    return float("nan") if v is None else v


def recall_at_fpr(y: np.ndarray, scores: np.ndarray, fpr: float = 0.01) -> float | None:
    """Recall at exactly ``fpr``, interpolated on the ROC curve of (y, scores).

    This peeks at the benign scores of the data it is measured on (an oracle
    threshold); a deployed tier's recall is measured at a threshold chosen
    elsewhere (``threshold_at_fpr`` on validation data).
    """
    from sklearn.metrics import roc_curve

    if not _both_classes(y):
        return None
    f, t, _ = roc_curve(y, scores)
    return float(np.interp(fpr, f, t))


def threshold_at_fpr(benign_scores: np.ndarray, fpr: float) -> float:
    """The smallest threshold whose false-positive rate on ``benign_scores`` is ≤ fpr."""
    s = np.sort(np.asarray(benign_scores, dtype=np.float64))[::-1]
    if len(s) == 0:
        return 1.0
    k = int(np.floor(fpr * len(s)))  # at most k benign scores may reach the threshold
    return float(np.nextafter(s[k], np.inf)) if k < len(s) else float(s[-1])


def wilson_interval(caught: float, total: float, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of the proportion ``caught / total`` (95 % by default).

    None when ``total`` is 0. The PromQL of the dashboards (``dashboards.promql.wilson``)
    computes the same interval, so a panel and ``monitor report`` agree.
    """
    if total <= 0:
        return None
    p = caught / total
    z2 = z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z * ((p * (1 - p) / total + z2 / (4 * total * total)) ** 0.5) / (1 + z2 / total)
    lower = 0.0 if caught <= 0 else max(0.0, min(p, centre - half))
    upper = 1.0 if caught >= total else min(1.0, max(p, centre + half))
    return lower, upper
