"""Linear probes as scikit-learn estimators (STYLE: ``__init__`` stores, ``fit`` returns self).

- :class:`LogisticProbe`: standardise, then L2 logistic regression. Exactly
  ``make_pipeline(StandardScaler(), LogisticRegression(C=C, ...))``, with the
  learned direction also exposed in raw activation space (``coef_``, ``intercept_``).
- :class:`DiffMeansProbe`: the baseline. The direction is the difference of the
  class means (harmful − benign), optionally over standardised features; the
  projection is turned into a probability by a one-feature logistic fit
  (Platt scaling) on the training data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import unique_labels
from sklearn.utils.validation import check_is_fitted, validate_data


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50, 50)))


class _BinaryProbe(ClassifierMixin, BaseEstimator):
    classes_: np.ndarray

    def decision_function(self, X: Any) -> np.ndarray:
        raise NotImplementedError

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        p = _sigmoid(self.decision_function(X))
        return np.stack([1.0 - p, p], axis=1)

    def predict(self, X: Any) -> np.ndarray:
        return np.asarray(self.classes_[(self.decision_function(X) > 0).astype(int)])

    def _check_labels(self, y: np.ndarray) -> None:
        self.classes_ = unique_labels(y)
        if len(self.classes_) != 2:
            raise ValueError(f"a probe needs two classes, got {list(self.classes_)}")


class LogisticProbe(_BinaryProbe):
    """Standardise + logistic regression; ``decision_function`` is the logit of class 1."""

    def __init__(
        self,
        C: float = 1.0,
        max_iter: int = 2000,
        class_weight: str | dict[Any, float] | None = None,
        tol: float = 1e-4,
    ) -> None:
        self.C = C
        self.max_iter = max_iter
        self.class_weight = class_weight
        self.tol = tol

    def fit(self, X: Any, y: Any) -> LogisticProbe:
        X, y = validate_data(self, X, y, dtype=np.float64)
        self._check_labels(y)
        self.scaler_ = StandardScaler().fit(X)
        self.lr_ = LogisticRegression(
            C=self.C, max_iter=self.max_iter, class_weight=self.class_weight, tol=self.tol
        ).fit(self.scaler_.transform(X), y)
        scale = np.where(self.scaler_.scale_ == 0, 1.0, self.scaler_.scale_)
        self.coef_ = self.lr_.coef_[0] / scale
        self.intercept_ = float(self.lr_.intercept_[0] - self.coef_ @ self.scaler_.mean_)
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.lr_.decision_function(self.scaler_.transform(X)))


class DiffMeansProbe(_BinaryProbe):
    """Difference-of-means direction, Platt-scaled into a probability."""

    def __init__(self, standardize: bool = False) -> None:
        self.standardize = standardize

    def fit(self, X: Any, y: Any) -> DiffMeansProbe:
        X, y = validate_data(self, X, y, dtype=np.float64)
        self._check_labels(y)
        pos = y == self.classes_[1]
        self.mean_ = X.mean(0)
        self.scale_ = X.std(0) if self.standardize else np.ones(X.shape[1])
        self.scale_[self.scale_ == 0] = 1.0
        Z = (X - self.mean_) / self.scale_
        d = Z[pos].mean(0) - Z[~pos].mean(0)
        self.direction_ = d / (np.linalg.norm(d) or 1.0)
        proj = Z @ self.direction_
        platt = LogisticRegression(C=100.0).fit(proj.reshape(-1, 1), pos.astype(int))
        self.a_, self.b_ = float(platt.coef_[0, 0]), float(platt.intercept_[0])
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.a_ * (((X - self.mean_) / self.scale_) @ self.direction_) + self.b_)
