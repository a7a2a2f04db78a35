"""Grouped cross-validation never leaks a task; the sweep finds the informative layer."""

from __future__ import annotations

import numpy as np

from probes.sweep import calibrate_threshold, grouped_folds, sweep_layers


def grouped_data(n_groups: int = 40, per: int = 12, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    groups = [f"suite/user_task_{g}" for g in range(n_groups) for _ in range(per)]
    y = np.array([int(rng.random() < 0.3) for _ in groups])
    return groups, y, rng


def test_grouped_folds_never_put_a_task_on_both_sides() -> None:
    groups, y, _ = grouped_data()
    folds = grouped_folds(y, groups, n_splits=5)
    assert len(folds) == 5
    g = np.array(groups)
    seen_val: list[str] = []
    for tr, va in folds:
        assert not set(g[tr]) & set(g[va])
        assert y[va].sum() > 0  # stratified: every fold has harmful steps
        seen_val.extend(set(g[va]))
    assert sorted(seen_val) == sorted(set(groups))  # each task is validated exactly once


def test_sweep_picks_the_informative_layer() -> None:
    groups, y, rng = grouped_data()
    feats = {}
    for layer in (1, 2, 3):
        for pooling in ("last", "mean"):
            X = rng.normal(size=(len(y), 20))
            if layer == 2 and pooling == "mean":
                X[:, 0] += 3.0 * y
            feats[(layer, pooling)] = X
    r = sweep_layers(feats, y, groups, C_grid=(0.1, 1.0), log=lambda m: None)
    assert (r.layer, r.pooling) == (2, "mean")
    best = next(x for x in r.rows if (x.layer, x.pooling) == (2, "mean"))
    assert best.cv_auroc is not None and best.cv_auroc > 0.95
    others = [x.cv_auroc or 0 for x in r.rows if (x.layer, x.pooling) != (2, "mean")]
    assert max(others) < 0.75


def test_threshold_holds_the_target_fpr() -> None:
    benign = np.random.default_rng(1).random(1000)
    for fpr in (0.0, 0.01, 0.2):
        t = calibrate_threshold(benign, fpr)
        assert (benign >= t).mean() <= fpr
    assert (benign >= calibrate_threshold(benign, 0.01)).mean() == 0.01
