"""Layer sweep with task-grouped cross-validation, and threshold calibration.

The sweep sees only the ``train`` split: for every (layer, pooling) it scores
out-of-fold with :class:`StratifiedGroupKFold` over the steps' task groups (no
task is ever on both sides of a fold), for the logistic probe and the
difference-of-means baseline. The best (layer, pooling) by out-of-fold AUROC
(ties: recall at 1 % FPR) is picked, its ``C`` tuned the same way, the probe
refitted on all of ``train``, and the threshold set on the benign ``val`` steps
at the target false-positive rate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.model_selection import StratifiedGroupKFold

from probes.estimators import DiffMeansProbe, LogisticProbe
from vigil.metrics import auroc, recall_at_fpr, threshold_at_fpr

# the project's one implementation; ``calibrate_threshold`` is the name L1 uses
calibrate_threshold = threshold_at_fpr


def grouped_folds(
    y: np.ndarray, groups: Sequence[str], n_splits: int = 5, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified folds where every group (task) lies wholly on one side."""
    groups_a = np.asarray(groups)
    n_splits = min(n_splits, len(set(groups_a.tolist())))
    cv = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    return [(tr, va) for tr, va in cv.split(np.zeros(len(y)), y, groups_a)]


def oof_scores(
    estimator: Any, X: np.ndarray, y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """Out-of-fold decision scores (a fold lacking a class gets the fold-free prior score 0)."""
    s = np.zeros(len(y))
    for tr, va in folds:
        if len(set(y[tr].tolist())) < 2:
            continue
        s[va] = clone(estimator).fit(X[tr], y[tr]).decision_function(X[va])
    return s


@dataclass(frozen=True)
class SweepRow:
    layer: int
    pooling: str
    cv_auroc: float | None
    cv_recall_at_1pct: float | None
    cv_auroc_diffmeans: float | None
    cv_recall_at_1pct_diffmeans: float | None


@dataclass
class SweepResult:
    rows: list[SweepRow]
    layer: int
    pooling: str
    C: float
    c_scores: dict[str, float | None] = field(default_factory=dict)
    folds: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d


def sweep_layers(
    features: Mapping[tuple[int, str], np.ndarray],
    y: np.ndarray,
    groups: Sequence[str],
    *,
    C: float = 0.1,
    C_grid: Sequence[float] = (0.01, 0.1, 1.0),
    n_splits: int = 5,
    fpr: float = 0.01,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> SweepResult:
    """Cross-validate every (layer, pooling) in ``features`` on the training steps."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    folds = grouped_folds(y, groups, n_splits, seed)
    rows: list[SweepRow] = []
    for layer, pooling in sorted(features):
        X = features[(layer, pooling)]
        s = oof_scores(LogisticProbe(C=C), X, y, folds)
        d = oof_scores(DiffMeansProbe(), X, y, folds)
        row = SweepRow(
            layer,
            pooling,
            auroc(y, s),
            recall_at_fpr(y, s, fpr),
            auroc(y, d),
            recall_at_fpr(y, d, fpr),
        )
        rows.append(row)
        log(
            f"sweep: layer {layer:2d} {pooling:4s} CV AUROC {_f(row.cv_auroc)} "
            f"recall@{fpr:.0%} {_f(row.cv_recall_at_1pct)} | diff-means AUROC "
            f"{_f(row.cv_auroc_diffmeans)}"
        )
    best = max(
        rows, key=lambda r: (round(r.cv_auroc or 0.0, 3), r.cv_recall_at_1pct or 0.0, -r.layer)
    )
    X = features[(best.layer, best.pooling)]
    c_scores: dict[str, float | None] = {}
    for c in C_grid:
        c_scores[str(c)] = auroc(y, oof_scores(LogisticProbe(C=c), X, y, folds))
    best_c = max(C_grid, key=lambda c: (round(c_scores[str(c)] or 0.0, 4), -c))
    log(f"sweep: chose layer {best.layer} ({best.pooling}), C={best_c} (CV AUROC by C {c_scores})")
    return SweepResult(rows, best.layer, best.pooling, best_c, c_scores, len(folds))


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
