"""Each RL-health formula against a hand-computed example, and the identities it rests on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.rlhealth import formulas as f
from monitor.rlhealth.simulate import boundary_dispatch_schedule


def test_staleness_per_sample_and_expected_mean() -> None:
    assert f.staleness([5, 5, 6], [4, 3, 6]).tolist() == [1, 2, 0]
    assert f.expected_staleness(1, 2) == 1.5
    assert f.expected_staleness(0.5, 1) == 0.5
    assert f.expected_staleness(0, 4) == 1.5
    with pytest.raises(ValueError):
        f.expected_staleness(1, 0)


@pytest.mark.parametrize(
    ("phi", "mu", "batch"), [(1, 2, 4), (0, 3, 2), (2, 1, 3), (0.5, 2, 4), (1.5, 4, 2), (3, 3, 5)]
)
def test_boundary_dispatch_schedule_has_the_predicted_mean(phi: float, mu: int, batch: int) -> None:
    """Initial (φ + μ)B dispatched at version 0, then μB per burst: past the first ⌈φ⌉
    warm-up steps, the mean over whole bursts is exactly φ + (μ − 1)/2."""
    warmup = math.ceil(phi)
    bursts = 20
    steps = warmup + bursts * mu
    dispatch, consumed = boundary_dispatch_schedule(phi, mu, batch, steps)
    assert len(dispatch) == steps * batch and np.all(np.diff(consumed) >= 0)
    assert np.all(dispatch % mu == 0)  # dispatched only when a burst publishes weights
    d = f.staleness(consumed, dispatch)[warmup * batch :]
    # whole bursts after the warm-up, aligned on the burst boundary
    assert d.mean() == pytest.approx(f.expected_staleness(phi, mu), abs=1e-12)
    assert d.min() >= math.floor(phi) and d.max() <= math.ceil(phi) + mu - 1


def test_drift_trust_region_and_turn_ratio_by_hand() -> None:
    new = [-0.2, -1.0, -2.0]
    old = [-1.0, -1.1, -1.5]
    # log ρ = [0.8, 0.1, −0.5]; M = 0.4 nats
    assert f.token_log_ratios(new, old) == pytest.approx([0.8, 0.1, -0.5])
    assert f.sequence_drift(new, old) == pytest.approx(0.4)
    # ρ = [2.2255, 1.1052, 0.6065]: only the first leaves |ρ − 1| ≤ 0.8
    assert f.out_of_trust_share(new, old, delta=0.8) == pytest.approx(1 / 3)
    assert f.out_of_trust_share(new, old, delta=0.3) == pytest.approx(2 / 3)
    # ρ_t = Π ρ = 2.2255 · 1.1052 · 0.6065 = e^0.4
    assert f.turn_ratio(new, old) == pytest.approx(2.225541 * 1.105171 * 0.606531, rel=1e-5)
    assert f.log_turn_ratio(new, old) == pytest.approx(0.4)
    assert f.out_of_trust_share([], []) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        f.sequence_drift([0.0], [0.0, 0.0])


def test_mismatch_by_hand() -> None:
    train, rollout = [-1.0, -2.0], [-1.1, -1.7]
    assert f.abs_logprob_mismatch(train, rollout) == pytest.approx([0.1, 0.3])
    # log r = [0.1, −0.3]: (e^0.1 − 1 − 0.1) + (e^−0.3 − 1 + 0.3)
    assert f.k3_kl(train, rollout) == pytest.approx(0.0051709 + 0.0408182, abs=1e-7)
    assert f.relative_extra_discrepancy(0.3, 0.2) == pytest.approx(0.5)
    assert f.k3_kl(rollout, rollout) == 0.0


def test_drift_and_mismatch_on_synthetic_logprobs_with_known_answers() -> None:
    rng = np.random.default_rng(0)
    rollout = -rng.exponential(0.5, size=400)
    # a constant shift c per token: M = c·L, |Δ| = c, k3 = L (e^c − 1 − c)
    c = 0.05
    assert f.sequence_drift(rollout + c, rollout) == pytest.approx(c * 400)
    assert f.abs_logprob_mismatch(rollout - c, rollout).mean() == pytest.approx(c)
    assert f.k3_kl(rollout + c, rollout) == pytest.approx(400 * (math.exp(c) - 1 - c))
    # tokens sampled from the rollout distribution p, scored under q: k3 → KL(p ‖ q)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.4, 0.4, 0.1, 0.1])
    tokens = rng.choice(4, size=200_000, p=p)
    k3_per_token = f.k3_kl(np.log(q[tokens]), np.log(p[tokens])) / tokens.size
    assert k3_per_token == pytest.approx(float(np.sum(p * np.log(p / q))), rel=0.03)


def test_symmax_by_hand() -> None:
    assert f.symmax_advantages([1, 0, 0, 0]) == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])
    assert f.symmax_advantages([1, 1, 0, 0]) == pytest.approx([1, 1, -1, -1])
    assert f.symmax_advantages([0.2, 0.5, 0.8, 0.5]) == pytest.approx([-1, 0, 1, 0])
    assert f.symmax_advantages([0.7, 0.7]).tolist() == [0.0, 0.0]


def test_mpo_credit_assignment_by_hand() -> None:
    values = [[0.1, 0.2, 0.4], [0.5, 0.9]]  # V_{t,i}; V_{2,1} := 0
    deltas = f.td_residuals(values, reward=1.0)
    assert deltas[0] == pytest.approx([0.1, 0.2, 0.1])  # 0.2−0.1, 0.4−0.2, V_{1,1}−0.4
    assert deltas[1] == pytest.approx([0.4, 0.1])  # 0.9−0.5, R + 0 − 0.9
    # δ^turn_t = 1{t=T} R + V_{t+1,1} − V_{t,1}
    assert f.turn_residuals(deltas) == pytest.approx([0.5 - 0.1, 1.0 + 0 - 0.5])
    a_turn = f.turn_advantages(deltas, lam=0.8)
    assert a_turn == pytest.approx([0.4 + 0.8 * 0.5, 0.5])
    intra = f.intra_turn_trace(deltas[0], lam_intra=0.95)
    assert intra == pytest.approx([0.38025, 0.295, 0.1])  # 0.1 + .95(0.2 + .95·0.1)
    split = f.mean_preserving_split(0.8, intra, beta=1.0)
    mean_intra = (0.38025 + 0.295 + 0.1) / 3
    assert split == pytest.approx([0.8 + x - mean_intra for x in (0.38025, 0.295, 0.1)])
    assert split.mean() == pytest.approx(0.8)
    a, per_token = f.token_advantages(values, 1.0)
    assert a == pytest.approx(a_turn)
    assert per_token[1] == pytest.approx([0.6975, 0.3025])  # 0.5 ± (0.495 − 0.2975)


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(
        st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=6), min_size=1, max_size=5
    ),
    reward=st.sampled_from([0.0, 1.0]),
    beta=st.floats(0, 2),
)
def test_mpo_identities(turns: list[list[float]], reward: float, beta: float) -> None:
    """Turn residual telescopes to R·1{t=T} + V_{t+1,1} − V_{t,1}; the split keeps the turn mean."""
    deltas = f.td_residuals(turns, reward)
    last = len(turns) - 1
    for t, d in enumerate(deltas):
        nxt = turns[t + 1][0] if t < last else 0.0
        assert d.sum() == pytest.approx(reward * (t == last) + nxt - turns[t][0], abs=1e-9)
    a_turn = f.turn_advantages(deltas)
    for t, d in enumerate(deltas):
        split = f.mean_preserving_split(float(a_turn[t]), f.intra_turn_trace(d), beta)
        assert split.mean() == pytest.approx(a_turn[t], abs=1e-9)
