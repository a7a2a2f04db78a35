"""The one linear estimator the trained signals fit: standardise, then an L2 logistic regression.

    fit = fit_standardised_logit(X, y, C=0.1)              # class-balanced by default
    p = sigmoid(fit.decision_function(X_new))

Standardisation is scikit-learn's (:class:`~sklearn.preprocessing.StandardScaler`: mean and
population standard deviation, a column with no spread gets scale 1, so after centring it is
all zeros and its weight stays 0). The result is plain arrays, so a signal keeps it in JSON
or safetensors and scores without scikit-learn. The provenance combination
(``worldmodel.provenance.ProvenanceHarm``) and the likelihood gain calibration
(``probes.likelihood.GainCalibration``) fit it; the activation probe
(``probes.estimators.LogisticProbe``) is the same estimator kept as scikit-learn objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vigil.metrics import sigmoid


@dataclass(frozen=True)
class StandardisedLogit:
    """A fitted standardise + logistic regression: ``logit = ((x − mean) / scale) · coef + b``."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray  # on standardised features
    intercept: float

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        return np.asarray((np.asarray(X, dtype=np.float64) - self.mean) / self.scale @ self.coef
                          + self.intercept)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """P(class 1) per row."""
        return np.asarray(sigmoid(self.decision_function(X)))


def standardiser(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, scale)`` of the columns of ``X``; scale 1 where a column has no spread."""
    X = np.asarray(X, dtype=np.float64)
    mean, scale = X.mean(0), X.std(0)
    return mean, np.where(scale == 0, 1.0, scale)


def fit_standardised_logit(
    X: np.ndarray,
    y: np.ndarray,
    C: float,
    *,
    class_weight: Any = "balanced",
    max_iter: int = 2000,
    tol: float = 1e-4,
) -> StandardisedLogit:
    """Standardise ``X`` and fit an L2 logistic regression (inverse strength ``C``)."""
    from sklearn.linear_model import LogisticRegression

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if len(set(y.tolist())) != 2:
        raise ValueError(f"need two classes to fit, got {sorted(set(y.tolist()))}")
    mean, scale = standardiser(X)
    lr = LogisticRegression(C=C, class_weight=class_weight, max_iter=max_iter, tol=tol)
    lr.fit((X - mean) / scale, y)
    return StandardisedLogit(mean, scale, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]))
