"""Linear probes as scikit-learn estimators (STYLE: ``__init__`` stores, ``fit`` returns self).

- :class:`LogisticProbe`: standardise, then L2 logistic regression. Exactly
  ``make_pipeline(StandardScaler(), LogisticRegression(C=C, ...))``, with the
  learned direction also exposed in raw activation space (``coef_``, ``intercept_``).
- :class:`DiffMeansProbe`: the baseline. The direction is the difference of the
  class means (harmful − benign), optionally over standardised features; the
  projection is turned into a probability by a one-feature logistic fit
  (Platt scaling) on the training data.

A fitted probe travels as plain data, never a pickle: ``to_arrays()`` gives its
hyper-parameters and scalars (JSON-ready) and its learned arrays (what a bundle keeps in
safetensors); ``from_arrays`` rebuilds a probe that scores bit for bit as the fitted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import unique_labels
from sklearn.utils.validation import check_is_fitted, validate_data

from vigil.metrics import sigmoid


class _BinaryProbe(ClassifierMixin, BaseEstimator):
    classes_: np.ndarray

    def decision_function(self, X: Any) -> np.ndarray:
        raise NotImplementedError

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        p = sigmoid(self.decision_function(X))
        return np.stack([1.0 - p, p], axis=1)

    def predict(self, X: Any) -> np.ndarray:
        return np.asarray(self.classes_[(self.decision_function(X) > 0).astype(int)])

    def _check_labels(self, y: np.ndarray) -> None:
        self.classes_ = unique_labels(y)
        if len(self.classes_) != 2:
            raise ValueError(f"a probe needs two classes, got {list(self.classes_)}")

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The fitted probe as JSON-ready values (hyper-parameters, classes, scalars) and
        named arrays; :meth:`from_arrays` turns them back into the same probe."""
        check_is_fitted(self)
        values = {
            "params": self.get_params(),
            "classes": self.classes_.tolist(),
            "n_features_in": int(self.n_features_in_),
        }
        return values, {}

    @classmethod
    def from_arrays(cls, values: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Self:
        """A fitted probe from what :meth:`to_arrays` gave (read back from JSON and safetensors)."""
        est = cls(**values["params"])
        est.classes_ = np.asarray(values["classes"])
        est.n_features_in_ = int(values["n_features_in"])
        return est


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

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        values, _ = super().to_arrays()
        if isinstance(self.class_weight, dict):  # JSON keys are strings: keep the pairs
            values["params"]["class_weight"] = [
                [np.asarray(k).item(), float(w)] for k, w in self.class_weight.items()
            ]
        values["intercept"] = self.intercept_
        values["n_samples_seen"] = np.asarray(self.scaler_.n_samples_seen_).tolist()
        arrays = {
            "coef": self.coef_,
            "scaler.mean": self.scaler_.mean_,
            "scaler.var": self.scaler_.var_,
            "scaler.scale": self.scaler_.scale_,
            "lr.coef": self.lr_.coef_,
            "lr.intercept": self.lr_.intercept_,
            "lr.n_iter": self.lr_.n_iter_,
        }
        return values, arrays

    @classmethod
    def from_arrays(cls, values: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Self:
        params = dict(values["params"])
        if isinstance(params.get("class_weight"), list):
            params["class_weight"] = {k: w for k, w in params["class_weight"]}
        est = super().from_arrays({**values, "params": params}, arrays)
        est.coef_ = np.asarray(arrays["coef"])
        est.intercept_ = float(values["intercept"])
        scaler = StandardScaler()
        scaler.n_features_in_ = est.n_features_in_
        scaler.n_samples_seen_ = np.asarray(values["n_samples_seen"])
        scaler.mean_ = np.asarray(arrays["scaler.mean"])
        scaler.var_ = np.asarray(arrays["scaler.var"])
        scaler.scale_ = np.asarray(arrays["scaler.scale"])
        lr = LogisticRegression(
            C=est.C, max_iter=est.max_iter, class_weight=est.class_weight, tol=est.tol
        )
        lr.n_features_in_ = est.n_features_in_
        lr.classes_ = est.classes_
        lr.coef_ = np.asarray(arrays["lr.coef"])
        lr.intercept_ = np.asarray(arrays["lr.intercept"])
        lr.n_iter_ = np.asarray(arrays["lr.n_iter"])
        est.scaler_, est.lr_ = scaler, lr
        return est


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

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        values, _ = super().to_arrays()
        values.update(a=self.a_, b=self.b_)
        return values, {"mean": self.mean_, "scale": self.scale_, "direction": self.direction_}

    @classmethod
    def from_arrays(cls, values: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Self:
        est = super().from_arrays(values, arrays)
        est.mean_ = np.asarray(arrays["mean"])
        est.scale_ = np.asarray(arrays["scale"])
        est.direction_ = np.asarray(arrays["direction"])
        est.a_, est.b_ = float(values["a"]), float(values["b"])
        return est
