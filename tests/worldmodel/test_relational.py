"""The relational L0 estimators follow the scikit-learn estimator contract (clone, params)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.base import clone

from worldmodel.relational import InjectionDetector, RelationalHarm


def _harm_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 9)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 4] + 0.3 * rng.standard_normal(200) > 0.8).astype(int)
    return x, y


def test_relational_harm_clones_with_its_params_and_the_clone_fits_to_the_same_scores() -> None:
    x, y = _harm_data()
    est = RelationalHarm(C=0.3)
    assert est.get_params() == {"C": 0.3}
    est.fit(x, y)
    twin = clone(est)
    assert twin is not est and twin.get_params() == {"C": 0.3}
    assert not hasattr(twin, "coef_")  # a clone carries no fitted state
    with pytest.raises(RuntimeError, match="not fitted"):
        twin.decision_function(x)
    assert twin.fit(x, y) is twin
    assert np.array_equal(twin.decision_function(x), est.decision_function(x))
    assert np.array_equal(twin.predict_proba(x), est.predict_proba(x))
    assert twin.set_params(C=2.0).C == 2.0
    assert not np.array_equal(twin.fit(x, y).coef_, est.coef_)


def test_relational_harm_bundle_form_is_unchanged_and_loads_back() -> None:
    x, y = _harm_data()
    est = RelationalHarm(C=0.5).fit(x, y)
    d = json.loads(json.dumps(est.to_dict()))
    assert set(d) == {"C", "mean", "scale", "coef", "intercept"}
    again = RelationalHarm.from_dict(d)
    assert again.get_params() == {"C": 0.5}
    assert np.allclose(again.decision_function(x), est.decision_function(x))
    # a bundle's "harm" entry as written before the estimator became a BaseEstimator
    saved = {
        "C": 1.0,
        "mean": [0.0, 1.0],
        "scale": [1.0, 2.0],
        "coef": [0.5, -1.0],
        "intercept": 0.25,
    }
    loaded = RelationalHarm.from_dict(saved)
    assert loaded.decision_function(np.array([[2.0, 3.0]]))[0] == pytest.approx(0.25)
    assert loaded.to_dict() == saved


def test_injection_detector_clones_and_the_clone_fits_to_the_same_scores() -> None:
    rng = np.random.default_rng(0)
    text = rng.standard_normal((30, 16)).astype(np.float32)
    chunk_lists = [[i % 30, (i + 3) % 30] for i in range(40)]
    y = (np.arange(40) % 4 == 0).astype(int)
    det = InjectionDetector(epochs=20, seed=7).fit(text, chunk_lists, y)
    twin = clone(det)
    assert twin.get_params() == {"l2": 1e-3, "epochs": 20, "lr": 0.05, "seed": 7}
    assert not hasattr(twin, "coef_")
    twin.fit(text, chunk_lists, y)
    assert np.array_equal(twin.score(text, chunk_lists), det.score(text, chunk_lists))


def test_relational_harm_learns_steps_from_trajectory_labels_and_keeps_its_bundle_form() -> None:
    """Rows labelled only through their trajectory (bags of 5; unsafe if any step is): the
    MIL fit ranks unseen steps better than labelling every step with its trajectory's label,
    and it is saved and loaded as before."""
    from vigil.metrics import auroc

    x, y = _harm_data()
    bags = np.arange(len(y)) // 5
    bag_labels = {int(b): int(y[bags == b].max()) for b in np.unique(bags)}
    unknown = np.full(len(y), np.nan)
    mil = RelationalHarm(C=0.5).fit(x, unknown, bags=bags, bag_labels=bag_labels)
    naive = RelationalHarm(C=0.5).fit(x, np.array([bag_labels[int(b)] for b in bags]))
    rng = np.random.default_rng(103)
    xt = rng.standard_normal((200, 9)).astype(np.float32)
    yt = (xt[:, 0] + 0.5 * xt[:, 4] + 0.3 * rng.standard_normal(200) > 0.8).astype(int)
    a_mil, a_naive = auroc(yt, mil.decision_function(xt)), auroc(yt, naive.decision_function(xt))
    assert a_mil is not None and a_naive is not None and a_mil > a_naive + 0.03
    d = json.loads(json.dumps(mil.to_dict()))
    assert set(d) == {"C", "mean", "scale", "coef", "intercept"}
    assert np.allclose(RelationalHarm.from_dict(d).decision_function(xt), mil.decision_function(xt))
    assert clone(mil).get_params() == {"C": 0.5}
