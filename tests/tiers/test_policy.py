"""The tier policy: config validation, non-negative stacking, budgets, monotonicity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.tiers import (
    CalibratedPolicy,
    Gate,
    PolicyError,
    StackedCombiner,
    default_policy_config,
    load_policy_config,
    policy_config_from_dict,
    signal_matrix,
    threshold_for,
)

NAMES = ("a", "b", "c")


def _synthetic(n: int, rng: np.random.Generator, harmful_share: float = 0.3):
    y = (rng.random(n) < harmful_share).astype(int)
    # signal a is informative, b weakly, c is noise; all probabilities
    za = rng.normal(2.0 * y, 1.0)
    zb = rng.normal(0.7 * y, 1.0)
    zc = rng.normal(0.0, 1.0, n)
    X = 1 / (1 + np.exp(-np.stack([za, zb, zc], axis=1)))
    rows = [dict(zip(NAMES, map(float, r), strict=True)) for r in X]
    return rows, y


def _policy(rng: np.random.Generator, budgets=(0.2, 0.02, 0.002)) -> CalibratedPolicy:
    rows, y = _synthetic(4000, rng)
    gates = []
    for k, names in enumerate((("a",), ("a", "b"), NAMES)):
        comb = StackedCombiner().fit(signal_matrix(rows, names), y)
        p = comb.predict_proba(signal_matrix(rows, names))[:, 1]
        gates.append(Gate(k, names, budgets[k], comb, threshold_for(p[y == 0], budgets[k], 1)))
    g0, g1, g2 = gates
    return CalibratedPolicy(default_policy_config(), (g0, g1, g2), block_threshold=0.99)


def test_stacking_weights_are_non_negative_and_rank_the_informative_signal_first() -> None:
    rows, y = _synthetic(3000, np.random.default_rng(0))
    comb = StackedCombiner().fit(signal_matrix(rows, NAMES), y)
    assert (comb.coef_ >= 0).all()
    assert comb.coef_[0] > comb.coef_[1] > comb.coef_[2] - 1e-9
    # a missing signal is imputed, not an error
    X = signal_matrix([{"a": 0.9}], NAMES)
    assert np.isnan(X[0, 1])
    assert 0 < comb.predict_proba(X)[0, 1] < 1


def test_a_signal_no_step_has_is_fitted_quietly_and_weighs_nothing() -> None:
    """A configured signal the data never carries (rl_timed_out outside RL rollouts) gets the
    neutral fill and no weight, without numpy's all-NaN warning in `monitor calibrate`."""
    import warnings

    rows, y = _synthetic(600, np.random.default_rng(2))
    names = (*NAMES, "absent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comb = StackedCombiner().fit(signal_matrix(rows, names), y)
    assert comb.fill_[-1] == 0.5 and comb.coef_[-1] == 0.0


def test_stacking_beats_the_best_single_signal_when_both_carry_information() -> None:
    from vigil.metrics import auroc

    rng = np.random.default_rng(1)
    rows, y = _synthetic(3000, rng)
    comb = StackedCombiner().fit(signal_matrix(rows, NAMES), y)
    rows_t, y_t = _synthetic(3000, rng)
    p = comb.predict_proba(signal_matrix(rows_t, NAMES))[:, 1]
    best_single = auroc(y_t, signal_matrix(rows_t, NAMES)[:, 0])
    assert auroc(y_t, p) > best_single


@settings(max_examples=200, deadline=None)
@given(
    base=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
    which=st.integers(0, 2),
    bump=st.floats(0.0, 1.0),
    through=st.integers(0, 2),
)
def test_a_higher_score_never_lands_in_a_lower_tier(
    base: list[float], which: int, bump: float, through: int
) -> None:
    policy = _POLICY
    low = dict(zip(NAMES, base, strict=True))
    high = dict(low)
    high[NAMES[which]] = min(1.0, low[NAMES[which]] + bump)
    d_low, d_high = policy.decide_many([low, high], through=through)
    assert d_high.tier >= d_low.tier
    assert d_high.gate_scores[0] >= d_low.gate_scores[0]


_POLICY = _policy(np.random.default_rng(7))


def test_calibrated_budgets_hold_on_fresh_benign_steps() -> None:
    """Thresholds set on one benign sample pass about the budget of another."""
    rng = np.random.default_rng(3)
    budgets = (0.2, 0.05, 0.01)
    policy = _policy(rng, budgets)
    # recalibrate the cascade on a validation sample, then measure on a held-out one
    val_rows, val_y = _synthetic(20000, rng)
    benign = [r for r, yy in zip(val_rows, val_y, strict=True) if yy == 0]
    gates = []
    alive = benign
    for g in policy.gates:
        p = g.probability(alive)
        thr = threshold_for(p, g.budget, len(benign))
        gates.append(Gate(g.tier, g.signals, g.budget, g.combiner, thr))
        alive = [r for r, pi in zip(alive, p, strict=True) if pi >= thr]
    g0, g1, g2 = gates
    cal = CalibratedPolicy(policy.config, (g0, g1, g2), block_threshold=0.99)
    test_rows, test_y = _synthetic(20000, rng)
    tiers = np.array([d.tier for d in cal.decide_many(test_rows)])[test_y == 0]
    n = len(tiers)
    for k, b in enumerate(budgets, start=1):
        share = (tiers >= k).mean()
        tol = 4 * np.sqrt(b * (1 - b) / n)  # four binomial standard errors
        assert abs(share - b) <= tol, (k, share, b)


def test_policy_round_trip_decides_identically(tmp_path: Path) -> None:
    rows, _ = _synthetic(500, np.random.default_rng(5))
    path = _POLICY.save(tmp_path / "policy.json")
    again = CalibratedPolicy.load(path)
    assert [d.tier for d in again.decide_many(rows)] == [d.tier for d in _POLICY.decide_many(rows)]
    assert np.allclose(
        [d.score for d in again.decide_many(rows)], [d.score for d in _POLICY.decide_many(rows)]
    )


def test_policy_file_errors_name_the_key(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("tiers:\n  L1:\n    budget: 2\n")
    with pytest.raises(PolicyError, match=r"policy.yaml: tiers.L1.budget must be a fraction"):
        load_policy_config(f)
    f.write_text("tiers:\n  L4: {}\n")
    with pytest.raises(PolicyError, match="unknown tier 'L4'"):
        load_policy_config(f)
    f.write_text("tiers:\n  L0: {budget: 0.01}\n  L1: {budget: 0.05}\n")
    with pytest.raises(PolicyError, match="budgets must not grow"):
        load_policy_config(f)
    f.write_text("tiers: [\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy_config(f)
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy_config(tmp_path / "missing.yaml")
    with pytest.raises(PolicyError, match="unknown key 'budgets'"):
        policy_config_from_dict({"budgets": [1]})


def test_a_policy_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("flag_tier: 2\ntiers:\n  L1: {budget: 0.05, models: {probes: /x/probe}}\n")
    cfg = load_policy_config(f)
    assert cfg.flag_tier == 2
    assert cfg.budgets == (0.2, 0.05, 0.002)
    assert cfg.model("probes") == "/x/probe"
    assert "wm_harm_pre" in cfg.gate_signals(0)
    assert cfg.gate_signals(1)[-1] == "probe_harm"


def test_stacked_combiner_follows_the_sklearn_estimator_contract() -> None:
    from sklearn.base import clone

    rows, y = _synthetic(800, np.random.default_rng(3))
    X = signal_matrix(rows, NAMES)
    est = StackedCombiner(C=0.5, class_weight=None)
    assert est.get_params() == {"C": 0.5, "class_weight": None}
    fitted = est.fit(X, y)
    assert fitted is est
    twin = clone(est)
    assert not hasattr(twin, "coef_") and twin.get_params() == est.get_params()
    np.testing.assert_allclose(twin.fit(X, y).predict_proba(X), est.predict_proba(X))
    assert set(np.unique(est.predict(X))) <= {0, 1}
    assert est.score(X, y) > 0.7  # ClassifierMixin: accuracy
    # a saved combiner loads into the same decisions
    back = StackedCombiner.from_dict(est.to_dict())
    np.testing.assert_allclose(back.predict_proba(X), est.predict_proba(X))
