"""The probes follow the scikit-learn estimator contract and match sklearn's own models."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from probes.estimators import DiffMeansProbe, LogisticProbe


def blobs(n: int = 400, d: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    direction = rng.normal(size=d)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 20, size=d) + 5.0
    X += np.outer(y, direction) * 1.5
    return X, y


PROBES = [LogisticProbe(C=0.3), DiffMeansProbe(standardize=True)]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: type(p).__name__)
def test_estimator_contract(probe: LogisticProbe | DiffMeansProbe) -> None:
    X, y = blobs()
    params = probe.get_params()
    fresh = clone(probe)
    assert fresh.get_params() == params  # __init__ only stores its arguments
    assert not [k for k in vars(fresh) if k.endswith("_")]  # no learned state before fit
    with pytest.raises(NotFittedError):
        fresh.predict_proba(X)
    assert fresh.fit(X, y) is fresh  # fit returns self
    learned = [k for k in vars(fresh) if k not in params]
    assert learned and all(k.endswith("_") for k in learned), learned
    p = fresh.predict_proba(X)
    assert p.shape == (len(X), 2) and np.allclose(p.sum(1), 1.0)
    assert set(fresh.predict(X)) <= {0, 1}
    assert fresh.n_features_in_ == X.shape[1]
    assert fresh.score(X, y) > 0.8  # ClassifierMixin.score
    with pytest.raises(ValueError):
        fresh.predict_proba(X[:, :5])  # wrong width is refused
    with pytest.raises(ValueError):
        clone(probe).fit(X, np.zeros(len(X), dtype=int))  # one class is refused


def test_grid_search_and_pipeline_work() -> None:
    X, y = blobs()
    gs = GridSearchCV(LogisticProbe(), {"C": [0.01, 1.0]}, cv=3, scoring="roc_auc").fit(X, y)
    assert gs.best_params_["C"] in (0.01, 1.0)
    pipe = make_pipeline(StandardScaler(), DiffMeansProbe()).fit(X, y)
    assert pipe.predict_proba(X).shape == (len(X), 2)


def test_logistic_probe_matches_sklearn() -> None:
    X, y = blobs(d=48, seed=3)
    ours = LogisticProbe(C=0.5).fit(X, y)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=2000)).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    # the direction in raw activation space gives the same logits
    np.testing.assert_allclose(
        X @ ours.coef_ + ours.intercept_, ours.decision_function(X), atol=1e-6
    )


def test_diffmeans_direction_is_the_mean_difference() -> None:
    X, y = blobs(d=16, seed=5)
    p = DiffMeansProbe().fit(X, y)
    d = X[y == 1].mean(0) - X[y == 0].mean(0)
    np.testing.assert_allclose(p.direction_, d / np.linalg.norm(d), atol=1e-10)
    assert p.a_ > 0  # a larger projection means more likely harmful
