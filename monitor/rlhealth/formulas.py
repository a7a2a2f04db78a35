"""The RL-health formulas (DESIGN §5), one pure numpy function each.

Every function takes plain arrays (log-probabilities in nats, rewards, critic
values) and returns numbers; none knows about records or streams, so each is
tested against a hand-computed example. Sources: elastic RL scheduling
(staleness), BRAT (drift, trust region, SymMax), MPO (whole-turn ratio, TD
residuals, turn-level GAE, intra-turn trace, mean-preserving split), and
low-precision rollout engines (k3 mismatch, relative extra discrepancy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


def _vec(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _pair(new: ArrayLike, old: ArrayLike) -> tuple[Array, Array]:
    a, b = _vec(new), _vec(old)
    if a.shape != b.shape:
        raise ValueError(f"log-probabilities differ in length: {a.size} vs {b.size}")
    return a, b


# --- staleness (elastic scheduling) --------------------------------------------


def staleness(consumed_version: ArrayLike, dispatch_version: ArrayLike) -> Array:
    """Per consumed sample ``d = v_t − v_d``: the trainer's version when the sample is
    consumed minus the latest published version when it was dispatched."""
    c, d = _vec(consumed_version), _vec(dispatch_version)
    if c.shape != d.shape:
        raise ValueError("consumed and dispatch versions differ in length")
    return c - d


def expected_staleness(phi: float, mu: int) -> float:
    """Boundary dispatch: ``E[d] = φ + (μ − 1)/2`` (φ: extra dispatch in batch units,
    μ: training steps per burst)."""
    if mu < 1:
        raise ValueError(f"mu (training steps per burst) must be >= 1, got {mu}")
    if phi < 0:
        raise ValueError(f"phi (extra dispatch) must be >= 0, got {phi}")
    return float(phi) + (mu - 1) / 2.0


# --- off-policy drift (BRAT) and the whole-turn ratio (MPO) ----------------------


def token_log_ratios(new_logprobs: ArrayLike, old_logprobs: ArrayLike) -> Array:
    """``log ρ_i = log π_θ(a_i) − log π_old(a_i)`` per token."""
    a, b = _pair(new_logprobs, old_logprobs)
    return a - b


def sequence_drift(new_logprobs: ArrayLike, old_logprobs: ArrayLike) -> float:
    """Per-sequence drift in nats: ``M = Σ_i (log π_θ(a_i) − log π_old(a_i))``."""
    return float(token_log_ratios(new_logprobs, old_logprobs).sum())


def out_of_trust_share(
    new_logprobs: ArrayLike, old_logprobs: ArrayLike, delta: float = 0.8
) -> float:
    """Share of tokens outside the trust region: ``mean_i 1{|ρ_i − 1| > δ}``, ``ρ_i =
    exp(log π_θ − log π_old)`` (BRAT's δ = 0.8). Zero for an empty sequence."""
    lr = token_log_ratios(new_logprobs, old_logprobs)
    if lr.size == 0:
        return 0.0
    return float(np.mean(np.abs(np.exp(lr) - 1.0) > delta))


def log_turn_ratio(new_logprobs: ArrayLike, old_logprobs: ArrayLike) -> float:
    """Log of MPO's whole-turn ratio ``ρ_t = Π_i ρ_{t,i}``, i.e. ``Σ_i log ρ_{t,i}``.

    Kept in log space: a 1,000-token turn overflows ``Π ρ`` long before it is
    alarming. ``exp`` of it is ``ρ_t``; for one assistant turn it equals ``exp(M)``.
    """
    return sequence_drift(new_logprobs, old_logprobs)


def turn_ratio(new_logprobs: ArrayLike, old_logprobs: ArrayLike) -> float:
    """MPO's whole-turn importance ratio ``ρ_t = Π_i π_θ(a_{t,i}) / π_old(a_{t,i})``."""
    return float(np.exp(log_turn_ratio(new_logprobs, old_logprobs)))


# --- rollout–training mismatch ------------------------------------------------------


def abs_logprob_mismatch(train_logprobs: ArrayLike, rollout_logprobs: ArrayLike) -> Array:
    """Per token ``|log p_train(a_i) − log p_rollout(a_i)|``."""
    return np.abs(token_log_ratios(train_logprobs, rollout_logprobs))


def k3_kl(train_logprobs: ArrayLike, rollout_logprobs: ArrayLike) -> float:
    """Schulman's k3 estimate of ``KL(p_rollout ‖ p_train)`` for one sequence sampled
    from the rollout engine: ``Σ_i (r_i − 1 − log r_i)``, ``r_i = p_train/p_rollout``.

    Every term is ≥ 0, so the estimate never goes negative, unlike ``Σ −log r_i``.
    """
    lr = token_log_ratios(train_logprobs, rollout_logprobs)
    return float(np.sum(np.expm1(lr) - lr))


def relative_extra_discrepancy(discrepancy: float, reference: float) -> float:
    """``(D_q − D_ref) / D_ref``: how much more mismatch this run has than a reference
    (e.g. the same model at a higher rollout precision)."""
    if reference <= 0:
        raise ValueError(f"reference discrepancy must be > 0, got {reference}")
    return (discrepancy - reference) / reference


# --- reward integrity (BRAT SymMax) -----------------------------------------------


def symmax_advantages(rewards: ArrayLike) -> Array:
    """SymMax group normalisation: ``(r − mean r) / max_j |r_j − mean r|``.

    Zero-sum in the group, bounded in [−1, 1], the minority gets ±1; a group
    with equal rewards has zero advantage everywhere.
    """
    r = _vec(rewards)
    if r.size == 0:
        return r
    centred = r - r.mean()
    scale = float(np.max(np.abs(centred)))
    if scale <= 1e-12:
        return np.zeros_like(r)
    return centred / scale


# --- harm attribution (MPO credit assignment) ------------------------------------------


def td_residuals(values: Sequence[ArrayLike], reward: float) -> list[Array]:
    """Token TD residuals ``δ_{t,i} = r_{t,i} + V_{t,i+1} − V_{t,i}`` (γ = 1).

    ``values[t]`` holds ``V_{t,1..L_t}`` (the critic at each token boundary of turn
    t). Boundaries: ``V_{t,L_t+1} := V_{t+1,1}`` and ``V_{T+1,1} := 0``; the only
    reward is the terminal ``R`` on the last token of the last turn.
    """
    turns = [_vec(v) for v in values]
    if any(v.size == 0 for v in turns):
        raise ValueError("every turn needs at least one token value")
    out: list[Array] = []
    for t, v in enumerate(turns):
        nxt = np.empty_like(v)
        nxt[:-1] = v[1:]
        nxt[-1] = turns[t + 1][0] if t + 1 < len(turns) else 0.0
        delta = nxt - v
        if t == len(turns) - 1:
            delta[-1] += reward
        out.append(delta)
    return out


def turn_residuals(deltas: Sequence[ArrayLike]) -> Array:
    """``δ^turn_t = Σ_i δ_{t,i}``; telescopes to ``1{t=T}·R + V_{t+1,1} − V_{t,1}``."""
    return np.array([float(_vec(d).sum()) for d in deltas], dtype=np.float64)


def turn_advantages(deltas: Sequence[ArrayLike], lam: float = 0.8) -> Array:
    """Turn-level GAE: ``A_t = δ^turn_t + λ A_{t+1}``, ``A_{T+1} = 0`` (MPO's λ = 0.8)."""
    dt = turn_residuals(deltas)
    adv = np.zeros_like(dt)
    acc = 0.0
    for t in range(dt.size - 1, -1, -1):
        acc = dt[t] + lam * acc
        adv[t] = acc
    return adv


def intra_turn_trace(delta: ArrayLike, lam_intra: float = 0.95) -> Array:
    """``A^intra_{t,i} = Σ_{j≥i} λ_intra^{j−i} δ_{t,j}``, truncated at the turn's end."""
    d = _vec(delta)
    out = np.zeros_like(d)
    acc = 0.0
    for i in range(d.size - 1, -1, -1):
        acc = d[i] + lam_intra * acc
        out[i] = acc
    return out


def mean_preserving_split(turn_advantage: float, intra: ArrayLike, beta: float = 1.0) -> Array:
    """``A_{t,i} = A_t + β (A^intra_{t,i} − mean_i A^intra_t)``: the least-squares
    projection of ``β A^intra_t`` onto vectors whose mean is ``A_t``."""
    a = _vec(intra)
    if a.size == 0:
        return a
    return turn_advantage + beta * (a - a.mean())


def token_advantages(
    values: Sequence[ArrayLike],
    reward: float,
    lam: float = 0.8,
    lam_intra: float = 0.95,
    beta: float = 1.0,
) -> tuple[Array, list[Array]]:
    """MPO credit assignment end to end: ``(A_t per turn, A_{t,i} per token)``."""
    deltas = td_residuals(values, reward)
    a_turn = turn_advantages(deltas, lam)
    per_token = [
        mean_preserving_split(float(a_turn[t]), intra_turn_trace(d, lam_intra), beta)
        for t, d in enumerate(deltas)
    ]
    return a_turn, per_token


__all__ = [
    "abs_logprob_mismatch",
    "expected_staleness",
    "intra_turn_trace",
    "k3_kl",
    "log_turn_ratio",
    "mean_preserving_split",
    "out_of_trust_share",
    "relative_extra_discrepancy",
    "sequence_drift",
    "staleness",
    "symmax_advantages",
    "td_residuals",
    "token_advantages",
    "token_log_ratios",
    "turn_advantages",
    "turn_ratio",
    "turn_residuals",
]


# --- ART: flow / diffusion models trained from black-box rewards ------------------


def reward_normaliser(rewards: ArrayLike) -> float:
    """``Z_c``: the spread (population standard deviation) of one prompt's K rewards. A
    prompt whose rewards are all equal (``Z_c → 0``) carries no learning signal."""
    r = _vec(rewards)
    if r.size == 0:
        raise ValueError("a prompt needs at least one reward")
    return float(r.std())


def normalised_rewards(rewards: ArrayLike, z: float | None = None, eps: float = 1e-12) -> Array:
    """``r_i = ½[1 + clip((R_i − R̄_c)/Z_c, −1, 1)]``; ``Z_c`` defaults to
    :func:`reward_normaliser`. Equal rewards (``Z_c ≤ eps``) all map to ½."""
    r = _vec(rewards)
    z = reward_normaliser(r) if z is None else float(z)
    if z <= eps:
        return np.full_like(r, 0.5)
    return 0.5 * (1.0 + np.clip((r - r.mean()) / z, -1.0, 1.0))


def guidance_direction(rewards: ArrayLike, endpoints: ArrayLike) -> Array:
    """The aggregate-first direction ``G(c) = Cov / RMS(Cov)``, ``Cov = (1/K) Σ_i (R_i −
    R̄_c)(x0_i − x̄0_c)``, for K endpoints ``(K, D)``; zeros when Cov vanishes."""
    r = _vec(rewards)
    x = np.asarray(endpoints, dtype=np.float64).reshape(r.size, -1)
    cov = ((r - r.mean())[:, None] * (x - x.mean(axis=0))).mean(axis=0)
    rms = float(np.sqrt(np.mean(cov**2)))
    return cov / rms if rms > 0 else np.zeros_like(cov)


def kl_proxy(mu: ArrayLike, mu_ref: ArrayLike, sigma_ref: float) -> float:
    """``m(s_t) = ‖μ(s_t, v_θ) − μ(s_t, v_θ^(0))‖² / (2 D σ_ref²(t))`` for one state."""
    a, b = _pair(mu, mu_ref)
    if sigma_ref <= 0:
        raise ValueError(f"sigma_ref must be > 0, got {sigma_ref}")
    return float(np.sum((a - b) ** 2) / (2.0 * a.size * sigma_ref**2))


def trust_region_weight(
    t: float, m: float, drift: ArrayLike, direction: ArrayLike, delta: float = 1e-5
) -> float:
    """``w(s_t) = t[1 − 1{m ≥ δ} 1{⟨d, G − d⟩ > 0}]``: a state is masked (weight 0) when
    it has moved past the trust region and the update would push it further."""
    d, g = _pair(drift, direction)
    pushes = float(np.dot(d, g - d)) > 0.0
    return 0.0 if (m >= delta and pushes) else float(t)


def mean_pairwise_distance(embeddings: ArrayLike) -> float:
    """Mean Euclidean distance over the pairs of rows ``(K, D)``: how far a prompt's
    endpoints lie from each other (falling: they collapse onto one image)."""
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] < 2:
        raise ValueError("need at least two embeddings, as a (K, D) array")
    sq = np.sum(e**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * e @ e.T, 0.0)
    iu = np.triu_indices(e.shape[0], k=1)
    return float(np.sqrt(d2[iu]).mean())
